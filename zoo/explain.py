"""Attribution methods for zoo's classifiers: which input patches (or tokens) a prediction rests on.

    attention             the last layer's attention of the class token (mean pooling: of all tokens), heads
                          averaged: what people usually plot
    rollout               Abnar & Zuidema 2020 (zoo.models.vit.attention_rollout, reused)
    grad_attention        Chefer et al. 2021, "Generic Attention-model Explainability" (eq. 5-6): per layer
                          A_bar = mean_h (grad_A * A)^+, propagated with the residual as R <- R + A_bar R, R_0 = I
    input_x_grad          gradient x input on the patch / token embeddings (Captum's LayerGradientXActivation)
    integrated_gradients  Sundararajan et al. 2017 on the embeddings, `steps` points of the path (Captum's
                          LayerIntegratedGradients); baseline: the embedding of an all-zero input
    random                a seeded uniform map: the floor a faithful method must beat

Every method returns one score per input token (patches in raster order, or the sequence's tokens), higher =
more evidence for the target class. The attention methods read the effective probabilities every kernel
returns with need_weights (the kernel contract), so every attention variant works. Gradients with respect to
a layer's attention map A are not taken through the kernel (fused, blockwise and linear kernels never form A
in the graph): the kernel's output is out = A v per head, so dy/dA = (dy/d out) v^T exactly, and dy/d out is
an ordinary gradient. The gradient methods use Captum (a maintained library whose LayerIntegratedGradients
and LayerGradientXActivation attribute to a layer's output, which is what "on the embeddings" means).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from zoo.attention.functional import repeat_kv
from zoo.models.clip import CLIP
from zoo.models.sequence_classifier import SequenceClassifier
from zoo.models.vit import ViT, attention_rollout

METHODS = ("attention", "rollout", "grad_attention", "input_x_grad", "integrated_gradients", "random")
ATTENTION_METHODS = ("attention", "rollout", "grad_attention")
EXPLAINABLE_FAMILIES = ("vit", "clip", "sequence_classifier")
DEFAULT_STEPS = 32  # integrated gradients' points on the path (Captum's Gauss-Legendre rule)


@dataclass
class Subject:
    """What the methods need of a model: the encoder whose blocks' attention they read, the module whose output
    is the token embeddings, the scores of the classes (B, classes) from the inputs, the tokens in front of the
    inputs' own (a class token) and the pooling (cls: the class token's row; mean: all rows)."""

    encoder: nn.Module
    embedding: nn.Module
    score: Callable[[torch.Tensor], torch.Tensor]
    prefix: int
    pool: str
    channel_dim: int  # the embedding output's channel axis (1: a patch convolution's (B, dim, rows, cols))


def subject_of(model: nn.Module, text_embeddings: torch.Tensor | None = None) -> Subject:
    """The Subject of a ViT, a sequence classifier, or CLIP's image tower scored against `text_embeddings`
    (K, E) (class prompts or captions; the scores are CLIP's logits scale * cos)."""
    if isinstance(model, CLIP):
        if text_embeddings is None:
            raise ValueError("explaining CLIP's image tower needs the text embeddings to score the image against")
        tower = model.image_encoder

        def score(images: torch.Tensor) -> torch.Tensor:
            return model.scale() * model.encode_image(images) @ text_embeddings.T

        return Subject(tower, tower.patch_embed, score, prefix_of(tower), tower.config.pool, 1)
    if isinstance(model, ViT):
        return Subject(model, model.patch_embed, model, prefix_of(model), model.config.pool, 1)
    if isinstance(model, SequenceClassifier):
        return Subject(model, model.token_embedding, model, prefix_of(model), model.config.pool, -1)
    raise ValueError(
        f"no attribution methods for a {type(model).__name__}; valid: ViT, CLIP (image tower), SequenceClassifier"
    )


def prefix_of(encoder: nn.Module) -> int:
    return 1 if getattr(encoder, "cls_token", None) is not None else 0


@dataclass
class AttentionRecord:
    """One layer's kernel call: output (B, H, T, D), effective probabilities (B, H, T, S), values (B, G, S, D)."""

    out: torch.Tensor
    weights: torch.Tensor
    values: torch.Tensor


@contextmanager
def recorded_attention(encoder: nn.Module) -> Iterator[list[AttentionRecord]]:
    """While inside, every self-attention kernel of `encoder`'s blocks is asked for its weights and records its
    call, in block order. Hooks on the kernels, so no model code changes and any variant takes part."""
    records: list[AttentionRecord] = []

    def ask_for_weights(module, args, kwargs):  # the kernel's call (q, k, v, AttentionCall), weights asked
        q, k, v, call = args
        return (q, k, v, call.replace(need_weights=True)), kwargs

    def record(module, args, kwargs, output):
        values = args[2] if len(args) > 2 else kwargs["v"]
        records.append(AttentionRecord(output[0], output[1], values))

    handles = []
    for block in encoder.blocks:
        kernel = block.self_attn.kernel
        handles.append(kernel.register_forward_pre_hook(ask_for_weights, with_kwargs=True))
        handles.append(kernel.register_forward_hook(record, with_kwargs=True))
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()


def pooled_row(relevance: torch.Tensor, subject: Subject) -> torch.Tensor:
    """(B, N, N) token-to-token relevance -> (B, inputs): the class token's row, or with mean pooling the mean
    of all rows; the prefix tokens' own columns dropped."""
    row = relevance[:, 0] if subject.pool == "cls" and subject.prefix else relevance.mean(dim=1)
    return row[:, subject.prefix :]


def attention_gradient(record: AttentionRecord, out_grad: torch.Tensor) -> torch.Tensor:
    """dy/dA (B, H, T, S) from dy/d out (B, H, T, D): out = A v per head, so dy/dA = (dy/d out) v^T."""
    values = repeat_kv(record.values, out_grad.shape[1] // record.values.shape[1])
    return out_grad @ values.transpose(-1, -2)


def gradient_weighted_relevance(weights: list[torch.Tensor], gradients: list[torch.Tensor]) -> torch.Tensor:
    """Chefer et al. 2021, eq. 5-6: R = I; per layer from the first, A_bar = mean_h (grad * A)^+ and
    R <- R + A_bar R. weights, gradients: per layer (B, H, N, N) -> R (B, N, N)."""
    relevance = None
    for attention, gradient in zip(weights, gradients):
        weighted = (gradient * attention).clamp_min(0).mean(dim=1)  # (B, N, N)
        if relevance is None:
            relevance = torch.eye(weighted.shape[-1], dtype=weighted.dtype).expand_as(weighted)
        relevance = relevance + weighted @ relevance
    return relevance


def embedding_scores(attributions: torch.Tensor, subject: Subject) -> torch.Tensor:
    """Attributions of the embedding layer's output -> one per token: summed over the channels (B, tokens)."""
    return attributions.sum(dim=subject.channel_dim).flatten(1)


def captum_attr(method: str):
    """captum.attr, an optional dependency (the `explain` extra): only the gradient methods need it, and its import
    would otherwise slow every command's start."""
    try:
        import captum.attr
    except ImportError as error:
        raise ImportError(f"method={method} uses Captum: pip install captum (or zoo[explain])") from error
    return captum.attr


def predicted_class(subject: Subject, inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return subject.score(inputs).argmax(dim=-1)


def attribute(
    subject: Subject,
    inputs: torch.Tensor,
    method: str,
    target: torch.Tensor | None = None,
    *,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
) -> torch.Tensor:
    """Scores (B, tokens) of `method` for the `target` class of each input (default: the predicted one).
    inputs: images (B, C, H, W) or token ids (B, T), as the subject's model takes them."""
    if method not in METHODS:
        raise ValueError(f"unknown attribution method {method!r}; valid choices: {', '.join(METHODS)}")
    if target is None:
        target = predicted_class(subject, inputs)
    if method == "random":
        with torch.no_grad(), recorded_attention(subject.encoder) as records:
            subject.score(inputs[:1])  # only the token count: the map itself is seeded noise
        tokens = records[-1].weights.shape[-1] - subject.prefix
        generator = torch.Generator().manual_seed(seed)
        return torch.rand(inputs.shape[0], tokens, generator=generator)
    if method in ("attention", "rollout"):
        with torch.no_grad(), recorded_attention(subject.encoder) as records:
            subject.score(inputs)
        weights = [record.weights.float() for record in records]
        if method == "attention":
            return pooled_row(weights[-1].abs().mean(dim=1), subject)
        return pooled_row(attention_rollout(weights), subject)
    if method == "grad_attention":
        with torch.enable_grad(), recorded_attention(subject.encoder) as records:
            scores = subject.score(inputs).gather(1, target[:, None]).sum()
            out_grads = torch.autograd.grad(scores, [record.out for record in records])
        weights = [record.weights.detach().float() for record in records]
        gradients = [attention_gradient(r, g).detach().float() for r, g in zip(records, out_grads)]
        return pooled_row(gradient_weighted_relevance(weights, gradients), subject)
    captum = captum_attr(method)
    with torch.enable_grad():
        if method == "input_x_grad":
            explainer = captum.LayerGradientXActivation(subject.score, subject.embedding)
            attributions = explainer.attribute(inputs, target=target)
        else:
            explainer = captum.LayerIntegratedGradients(subject.score, subject.embedding)
            attributions = explainer.attribute(
                inputs, target=target, n_steps=steps, internal_batch_size=max(1, inputs.shape[0]) * 8
            )
    return embedding_scores(attributions.detach().float(), subject)
