"""Attention pictures a person can read: labelled axes, token labels on both axes, a colour bar, and the
values drawn are the values given."""

from __future__ import annotations

import warnings

import pytest
import torch

from zoo.training.attention_figures import grid_attention_figure, rollout_figure, token_attention_figure
from zoo.training.loggers import figure_to_array


def colour_bars(figure) -> list:
    return [axes for axes in figure.axes if axes.get_label() == "<colorbar>"]


def test_rollout_figure_shows_image_map_and_overlay_with_colour_bars() -> None:
    rollout = torch.rand(4, 4)
    figure = rollout_figure(torch.rand(1, 8, 8), rollout, "digit.png: 3 (0.91)")
    image, heat, overlay = [axes for axes in figure.axes if axes.get_label() != "<colorbar>"]
    assert (heat.get_xlabel(), heat.get_ylabel()) == ("patch column", "patch row")
    assert image.get_xlabel() == overlay.get_xlabel() == "x (pixels)"
    assert len(colour_bars(figure)) == 2 and figure._suptitle.get_text() == "digit.png: 3 (0.91)"
    assert torch.equal(torch.as_tensor(heat.images[0].get_array()), rollout)
    assert figure_to_array(figure).shape[-1] == 3


def test_grid_figure_has_a_panel_per_layer_and_head_and_one_colour_bar() -> None:
    maps = torch.rand(3, 2, 4, 4)
    figure = grid_attention_figure(maps, query="class token")
    panels = [axes for axes in figure.axes if axes.get_label() != "<colorbar>"]
    assert len(panels) == 6 and len(colour_bars(figure)) == 1
    assert [panel.get_title() for panel in panels[:2]] == ["head 0", "head 1"]
    assert panels[2].get_ylabel() == "layer 1\npatch row" and panels[-1].get_xlabel() == "patch column"
    assert torch.equal(torch.as_tensor(panels[3].images[0].get_array()), maps[1, 1])


def test_token_figure_labels_both_axes_with_the_tokens() -> None:
    weights = torch.rand(3, 5, 5).softmax(dim=-1)
    tokens = ["d", "e", "f", "▁", "("]
    figure = token_attention_figure(weights, tokens, "layer 0")
    panels = [axes for axes in figure.axes if axes.get_visible() and axes.get_label() != "<colorbar>"]
    assert len(panels) == 3 and len(colour_bars(figure)) == 1
    for panel in panels:
        assert [t.get_text() for t in panel.get_xticklabels()] == tokens
        assert [t.get_text() for t in panel.get_yticklabels()] == tokens
        assert (panel.get_xlabel(), panel.get_ylabel()) == ("key (attended to)", "query")
    with pytest.raises(ValueError, match="4 token labels for attention over 5 tokens"):
        token_attention_figure(weights, tokens[:4])


def test_signed_weights_get_a_scale_centred_on_zero() -> None:
    """Memory-compressed attention's effective weights of the values may be negative: none may be clipped."""
    maps = torch.rand(2, 2, 4, 4) - 0.3
    figure = grid_attention_figure(maps)
    image = [axes for axes in figure.axes if axes.get_label() != "<colorbar>"][0].images[0]
    low, high = image.get_clim()
    assert low == -high == -float(maps.abs().max()) and image.get_cmap().name == "coolwarm"
    assert colour_bars(figure)[0].get_ylabel() == "effective weight"
    assert grid_attention_figure(maps.abs()).axes[0].images[0].get_clim()[0] == 0.0


def test_tokens_without_a_glyph_are_labelled_by_their_escapes() -> None:
    """A char tokenizer's newline and control characters would draw as empty boxes (and make matplotlib warn)."""
    from zoo.training.loggers import heatmap_figure, tick_label

    assert [tick_label(t) for t in ["a", "\n", "\x02", " ", "é"]] == ["a", "\\n", "\\x02", " ", "é"]
    figure = heatmap_figure(torch.eye(3), ["a", "\n", "\x02"], ["a", "\n", "\x02"])
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == ["a", "\\n", "\\x02"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Glyph ... missing from font(s)" among them
        figure_to_array(figure)
