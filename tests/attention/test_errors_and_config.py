"""Bad arguments fail early with one line naming the value and the choices; conf/attention/ builds."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
import torch

from tests.variants import is_pattern_kernel, kernel_cases, supports
from zoo.attention import VARIANTS, AttentionConfig, MultiHeadAttention, TokenLayout
from zoo.attention.registry import cross_attention_variants, option_takers

from .helpers import use_blockwise_path

CONF = Path(__file__).resolve().parents[2] / "conf"


def one_line_error(build, *fragments: str) -> None:
    with pytest.raises(ValueError) as info:
        build()
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


ALL = str(sorted(VARIANTS))


def test_unknown_variant_names_the_choices() -> None:
    one_line_error(lambda: MultiHeadAttention(32, 4, variant="bigbird"), "'bigbird'", ALL)
    one_line_error(lambda: AttentionConfig(variant="Full"), "'Full'", ALL)


@pytest.mark.parametrize("window", [0, -4, None, 2.5, True])
def test_local_window_must_be_positive(window) -> None:
    one_line_error(lambda: MultiHeadAttention(32, 4, variant="local", window=window), repr(window), "positive int")
    one_line_error(lambda: AttentionConfig(variant="local", window=window), repr(window), "positive int")


def test_dim_not_divisible_by_heads_names_valid_head_counts() -> None:
    one_line_error(lambda: MultiHeadAttention(30, 4), "dim=30", "num_heads=4", "[1, 2, 3, 5, 6, 10, 15, 30]")


def test_bad_chunk_size_and_dropout() -> None:
    one_line_error(lambda: AttentionConfig(variant="linear", chunk_size=0), "chunk_size", "0")
    one_line_error(lambda: AttentionConfig(dropout=1.5), "dropout", "1.5")


def test_local_cross_attention_names_the_variants_that_support_it() -> None:
    module = MultiHeadAttention(16, 2, variant="local", window=4)
    one_line_error(
        lambda: module(torch.randn(1, 3, 16), torch.randn(1, 5, 16)), "'local'", str(cross_attention_variants())
    )


# Every kernel with its first example options; causal where it can be (variant: (options, causal)).
DROPOUT_CASES = {variant: (options, supports(variant, "causal")) for variant, options in kernel_cases(first_only=True)}


@pytest.mark.parametrize(
    ("variant", "blockwise"),
    [(variant, False) for variant in DROPOUT_CASES] + [(v, True) for v in DROPOUT_CASES if is_pattern_kernel(v)],
)
def test_attention_dropout_is_active_in_training_and_unbiased(variant: str, blockwise: bool, monkeypatch) -> None:
    if blockwise:  # the pattern kernels' blockwise path drops entries of the joint softmax
        use_blockwise_path(monkeypatch, fused=False)
    options, causal = DROPOUT_CASES[variant]
    torch.manual_seed(0)
    module = MultiHeadAttention(
        16, 2, variant=variant, causal=causal, dropout=0.5, layout=TokenLayout(max_length=12), **options
    )
    x = torch.randn(1, 12, 16)
    expected = module.eval()(x)
    module.train()
    module.kernel.eval()  # only dropout draws: a kernel's own training draws (lsh's hashes) stay as in eval
    samples = module(x.expand(600, 12, 16))  # 600 independent draws, one per batch row
    assert not torch.allclose(samples[0], samples[1])
    assert not torch.allclose(samples[0], expected[0])
    # E[dropout(p) / (1 - p)] = p: the mean over many draws approaches the eval output.
    error = (samples.mean(0) - expected[0]).abs().mean() / expected.abs().mean()
    assert error < 0.1, (variant, float(error))


def hydra_compose(overrides: list[str]):
    pytest.importorskip("hydra")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF / "attention"), version_base="1.3"):
        return compose(config_name=overrides[0], overrides=overrides[1:])


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "attention").glob("*.yaml")))
def test_attention_configs_build_every_variant(option: str) -> None:
    cfg = hydra_compose([option, "rope=true"] if option == "local" else [option])
    shared = set(AttentionConfig.setting_names())
    assert set(cfg) == shared | set(VARIANTS[cfg.variant].option_names())  # exactly its variant's options
    config = AttentionConfig(**cfg)
    causal = VARIANTS[cfg.variant].supports_causal
    module = MultiHeadAttention(32, 4, config, causal=causal, layout=TokenLayout(max_length=16))
    assert module.variant == cfg.variant
    assert (module.rotary is not None) == (option in ("rope", "local"))
    # Short sequences (shorter than local's window) still work.
    assert module(torch.randn(2, 7, 32)).shape == (2, 7, 32)


def test_the_shared_base_writes_exactly_the_config_fields_and_each_variant_yaml_its_options() -> None:
    from omegaconf import OmegaConf

    base = OmegaConf.load(CONF / "attention" / "base" / "settings.yaml")
    assert list(base) == [f.name for f in fields(AttentionConfig) if f.name != "options"]
    assert AttentionConfig(**base) == AttentionConfig()  # and at the dataclass's defaults
    for path in (CONF / "attention").glob("*.yaml"):
        assert_variant_yaml(path)


def assert_variant_yaml(path: Path) -> None:
    """conf/attention/<name>.yaml pulls in the shared base and adds its kernel's options (from the registry)."""
    from omegaconf import OmegaConf

    own = OmegaConf.to_container(OmegaConf.load(path))
    assert own.pop("defaults") == ["base/settings@_here_", "_self_"], path.name
    options = set(VARIANTS[own["variant"]].option_names())
    if path.stem in VARIANTS:  # a variant's yaml: its name and exactly its kernel's options
        assert own["variant"] == path.stem and set(own) == {"variant"} | options, path.name
    else:  # a named setting (rope.yaml): a variant with some shared settings or options changed
        assert set(own) <= set(AttentionConfig.setting_names()) | options, path.name


def test_every_variant_keeps_the_parameter_names_so_checkpoints_switch_variant() -> None:
    layout = TokenLayout(max_length=12)
    torch.manual_seed(0)
    full = MultiHeadAttention(16, 2, layout=layout).state_dict()
    for variant, (options, causal) in DROPOUT_CASES.items():
        module = MultiHeadAttention(16, 2, variant=variant, causal=causal, layout=layout, **options)
        result = module.load_state_dict(full, strict=False)
        assert not result.unexpected_keys
        extra = sorted(f"kernel.{key}" for key in module.kernel.state_dict())  # e.g. compressed's projections
        assert sorted(result.missing_keys) == extra, variant
        torch.testing.assert_close(module.in_proj.weight, full["in_proj.weight"])


def test_position_bias_errors_name_the_choices() -> None:
    takers = str(sorted(variant for variant, _ in kernel_cases(position_bias=True, first_only=True)))
    one_line_error(lambda: AttentionConfig(variant="linear", position_bias="alibi"), "'alibi'", takers)
    one_line_error(lambda: AttentionConfig(position_bias="rotary"), "'rotary'", "alibi, t5")
    one_line_error(lambda: AttentionConfig(position_bias="t5", num_buckets=2), "num_buckets", "2")
    one_line_error(lambda: AttentionConfig(position_bias="t5", num_buckets=32, max_distance=16), "max_distance", "16")
    one_line_error(lambda: AttentionConfig(share_bias="yes"), "share_bias", "'yes'")
    AttentionConfig(num_buckets=2)  # T5's settings are carried unused without position_bias=t5
    grid = TokenLayout(max_length=5, grid=(2, 2), prefix_tokens=1)
    one_line_error(lambda: MultiHeadAttention(32, 4, position_bias="alibi", layout=grid), "grid", "rope")
    module = MultiHeadAttention(32, 4, position_bias="alibi")
    one_line_error(lambda: module(torch.randn(1, 3, 32), positions=torch.arange(3)), "positions", "token order")


def test_kv_heads_errors_name_the_choices() -> None:
    one_line_error(lambda: MultiHeadAttention(32, 4, kv_heads=3), "kv_heads=3", "num_heads=4", "[1, 2, 4]")
    for bad in (0, -2, 1.5, True):
        one_line_error(lambda bad=bad: AttentionConfig(kv_heads=bad), "kv_heads", repr(bad))


def test_linear_feature_map_errors_name_the_choices() -> None:
    one_line_error(lambda: AttentionConfig(variant="linear", feature_map="exp"), "'exp'", "elu, favor, relu")
    one_line_error(lambda: AttentionConfig(variant="linear", num_features=0), "num_features", "0")
    one_line_error(lambda: AttentionConfig(variant="linear", redraw_interval=-1), "redraw_interval", "-1")


def test_vit_takes_no_sequence_position_bias() -> None:
    from zoo.models.vit import ViT

    one_line_error(
        lambda: ViT(image_size=8, patch_size=4, dim=16, depth=1, num_heads=2, attention={"position_bias": "alibi"}),
        "position_bias='alibi'", "rope",
    )  # fmt: skip


@pytest.mark.parametrize(("scaling", "parameters", "fragments"), [
    ("yarn", {"original_max_position_embeddings": 0},
     ["attention.rope_parameters.original_max_position_embeddings must be a positive int", "got 0"]),
    ("llama3", {"original_max_position_embeddings": -3},
     ["attention.rope_parameters.original_max_position_embeddings must be a positive int", "got -3"]),
    ("yarn", {"beta_fast": 0}, ["attention.rope_parameters.beta_fast must be a number > 0", "got 0"]),
    ("yarn", {"beta_slow": -1.0}, ["attention.rope_parameters.beta_slow must be a number > 0", "got -1.0"]),
    ("llama3", {"low_freq_factor": 4.0, "high_freq_factor": 4.0},
     ["attention.rope_parameters.high_freq_factor must be larger than low_freq_factor=4.0", "got 4.0"]),
])  # fmt: skip
def test_rope_parameter_values_are_checked_with_their_key_and_range(scaling, parameters, fragments) -> None:
    """Before: "math domain error" (yarn's log of 0 / L), a division by zero, or llama3 silently scaling everything."""
    settings = {"rope": True, "rope_scaling": scaling, "rope_factor": 2.0, "rope_parameters": parameters}
    one_line_error(lambda: AttentionConfig(**settings), *fragments)


# -- Options of another variant: refused in one line, read off the kernels' own declarations -----------------------
@pytest.mark.parametrize(("variant", "settings", "fragments"), [
    ("full", {"window": 32}, ["attention.window=32 is an option of local, routing, not of attention.variant=full",
                              "its options: none"]),
    ("local", {"num_features": 16}, ["attention.num_features=16 is an option of linear, not of attention.variant=local",
                                     "its options: window, chunk_size, global_tokens, sink_tokens"]),
    ("local", {"clusters": 4}, ["attention.clusters=4 is an option of routing, not of attention.variant=local"]),
    ("routing", {"hashes": 2}, ["attention.hashes=2 is an option of lsh, not of attention.variant=routing",
                                "its options: clusters, chunk_size, decay, local_heads, window, centroid_init"]),
    ("routing", {"chunk_keys": "bucket"}, ["attention.chunk_keys='bucket' is an option of lsh, not of "
                                           "attention.variant=routing"]),
    ("full", {"chunk_size": 16}, ["attention.chunk_size=16 is an option of additive, linear, local, lsh, routing, not "
                                  "of attention.variant=full"]),
])  # fmt: skip
def test_an_option_of_another_variant_is_refused_in_one_line(variant: str, settings: dict, fragments: list) -> None:
    one_line_error(lambda: AttentionConfig(variant=variant, **settings), *fragments)
    one_line_error(lambda: MultiHeadAttention(16, 2, variant=variant, **settings), *fragments)
    option, value = next(iter(settings.items()))  # and as the command line sets it: attention=<variant> +attention.x=
    cfg = hydra_compose([variant, f"+{option}={value}"])
    one_line_error(lambda: AttentionConfig(**cfg), *fragments)


def test_options_of_other_variants_at_their_defaults_are_carried_unused() -> None:
    """Every conf/attention/<variant>.yaml writes its kernel's defaults: a config with all their options at once (a
    sweep over variants may write one) is accepted by each variant, which takes only its own."""
    from omegaconf import OmegaConf

    written = {}
    for variant in VARIANTS:
        yaml = OmegaConf.to_container(OmegaConf.load(CONF / "attention" / f"{variant}.yaml"))
        written[variant] = {name: value for name, value in yaml.items() if name in VARIANTS[variant].option_names()}
    for variant, kernel in VARIANTS.items():
        others = {name: value for other, own in written.items() if other != variant for name, value in own.items()}
        others = {name: value for name, value in others.items() if name not in kernel.option_names()}
        config = AttentionConfig(variant=variant, **others)
        assert config.kernel_options() == {} and config.options == others, variant
    config = AttentionConfig(variant="full", window=256, chunk_size=64)  # local's default; lsh's (not local's None)
    assert config.to_dict()["window"] == 256 and config.build_kernel().options() == {}
    one_line_error(lambda: AttentionConfig(variant="full", global_tokens=False), "global_tokens=False")  # not 0


def non_default_options(variant: str, option: str) -> dict:
    """Options of `variant` that set `option` to a value other than its default and that the kernel accepts: an
    example set of the kernel's with it, else one of a few plain values."""
    default = VARIANTS[variant].option_defaults()[option]
    examples = [dict(e) for e in VARIANTS[variant].example_options if e.get(option, default) != default]
    plain = [{option: value} for value in (4, 2, 0.5, not default) if value != default]
    for options in examples + plain:
        try:
            AttentionConfig(variant=variant, **options)
        except ValueError:
            continue
        return options
    raise AssertionError(f"no value of {variant}'s {option} to test with: add one to its example_options")


def test_each_variant_takes_exactly_the_options_its_kernel_declares() -> None:
    """Every registered variant with every option any kernel declares, set to a value none of them defaults to:
    accepted (and handed to the kernel) where the variant's kernel declares it, refused in one line where not."""
    takers = option_takers()
    assert set(takers) == {name for kernel in VARIANTS.values() for name in kernel.option_names()}
    for option, defaults in takers.items():
        values = {variant: non_default_options(variant, option) for variant in defaults}
        for variant, kernel in VARIANTS.items():
            if variant in defaults:  # its own option (or one it shares with other variants)
                options = values[variant]
                config = AttentionConfig(variant=variant, **options)
                assert config.build_kernel().options()[option] == options[option], (variant, option)
                continue
            for options in values.values():  # another variant's value of it, set alone
                value = options[option]
                assert all(value != default for default in defaults.values())
                one_line_error(
                    lambda: AttentionConfig(variant=variant, **{option: value}),  # noqa: B023
                    f"attention.{option}={value!r} is an option of {', '.join(defaults)}, not of "
                    f"attention.variant={variant}; its options: {', '.join(kernel.option_names()) or 'none'}",
                )
    for variant in VARIANTS:  # the settings of MultiHeadAttention itself go with every variant
        AttentionConfig(variant=variant, rope=True, kv_heads=2, dropout=0.1)


def test_replace_with_another_variant_leaves_the_old_variants_options_behind() -> None:
    local = AttentionConfig(variant="local", window=32, global_tokens=2, rope=True)
    assert local.replace(variant="full").to_dict() == AttentionConfig(variant="full", rope=True).to_dict()
    sparse = local.replace(variant="sparse", stride=4)  # global tokens are sparse attention's option too
    assert sparse.kernel_options() == {"global_tokens": 2, "stride": 4} and "window" not in sparse.options
    one_line_error(lambda: local.replace(variant="full", window=16), "attention.window=16 is an option of local")


def test_named_choices_are_read_from_the_checks_not_from_their_wording(monkeypatch) -> None:
    """Kernel.option_choices and AttentionConfig.setting_choices take the choices check_choice was given (its
    ChoiceError's fields): a message worded otherwise changes nothing they say."""
    from zoo.attention.biases import POSITION_BIASES
    from zoo.attention.feature_maps import FEATURE_MAPS
    from zoo.attention.sparse import PATTERNS
    from zoo.errors import ChoiceError

    def expected() -> tuple[dict, dict]:
        return AttentionConfig.setting_choices(), {name: k.option_choices() for name, k in VARIANTS.items()}

    settings, options = expected()
    assert settings["position_bias"] == tuple(sorted(POSITION_BIASES)) and "kv_heads" not in settings
    assert options["linear"] == {"feature_map": tuple(sorted(FEATURE_MAPS))}
    assert options["sparse"] == {"pattern": tuple(sorted(PATTERNS))} and options["full"] == {}
    monkeypatch.setattr(ChoiceError, "__str__", lambda self: "reworded")
    assert expected() == (settings, options)
