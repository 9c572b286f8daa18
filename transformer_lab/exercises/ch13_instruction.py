"""Exercises of chapter 13, instruction tuning (指令微调): notebooks/13_instruction_tuning.ipynb.

1. `predict_lora_parameters`: how many numbers a LoRA of rank 8 trains on one layer (easy, predict).
2. `response_loss`: the SFT loss, counted on the response tokens only (medium, build).
3. `lora_forward`: a LoRA layer's output and its merged weight, mended (medium, debug the code).
4. `group_advantages`: each sample's reward against its own group's mean (medium, build).
5. `poem_reward`: the reward of a 藏头诗, a plain function of the text (harder, transfer).

Each reference agrees with `transformer_lab.finetune` on the exercise's cases (tests/test_exercises_ch13.py):
`finetune.response_loss`, `finetune.LoRALinear` and its `merge`, `finetune.group_advantages` and `finetune.poem_reward`
(whose form takes any letter outside ASCII as a character of a line; the exercise's form takes U+4E00 to U+9FFF, as
its text says).

Used in the notebook as `from transformer_lab.exercises import ch13_instruction as exercises`.
Shape legend: B batch, T positions, V vocabulary size, P prompts, G samples per prompt (a group), r LoRA's rank.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_lab import finetune
from transformer_lab.exercises.core import Case, Exercise, Mistake

__all__ = ["predict_lora_parameters", "response_loss", "lora_forward", "group_advantages", "poem_reward"]


def _one_output(candidate, *inputs):  # noqa: ANN001, ANN002, ANN202
    return (candidate(*inputs),)  # a 1-tuple, so that the feedback names it ("your loss is ...", not "output is")


# --- 1. predict: the parameters LoRA trains ----------------------------------------------------------


def _lora_parameters_reference() -> int:
    # nn.Linear(128, 512), the first layer of the base model's MLP: W is (512, 128), frozen with its bias.
    # LoRA of rank r = 8 trains A (r, in) = (8, 128) and B (out, r) = (512, 8).
    rank, fan_in, fan_out = 8, 128, 512
    return rank * fan_in + fan_out * rank  # 1,024 + 4,096 = 5,120


def _count_or_text(candidate):  # noqa: ANN001, ANN202
    value = candidate()
    return "a str" if isinstance(value, str) else value  # a count written as text gets its own explanation


predict_lora_parameters = Exercise(
    "predict_lora_parameters",
    reference=_lora_parameters_reference,
    cases=[Case("your count for LoRA of rank 8 on nn.Linear(128, 512)", lambda: ())],
    run=_count_or_text,
    hints=[
        "The layer's own weight W (512 x 128) and its bias are frozen: they count for nothing here. What does LoRA "
        "add beside them?",
        "LoRA adds two matrices, A and B, whose product B A has W's shape: A takes the layer's input to r numbers, "
        "B takes those r numbers to the layer's output.",
        "A is (r, in) and B is (out, r). Multiply out each shape with r = 8, in = 128, out = 512, and add.",
    ],
    level="easy",
    kind="predict",
    wrong=[lambda: 65536, lambda: 1024, lambda: 4096, lambda: 64],
    why=(
        "5,120 numbers: A is 8 x 128 (1,024) and B is 512 x 8 (4,096), against 65,536 in W. LoRA trains "
        "r (in + out) numbers instead of in x out, here 7.8 %; the smaller r, the smaller the share, and B A can "
        "change W only within a space of rank r."
    ),
    explain={
        65536: "that is the whole weight W (512 x 128), which LoRA freezes: count the two small matrices it adds.",
        66048: "that is W and its bias, both frozen: count the two small matrices LoRA adds.",
        1024: "that is A alone (8 x 128): B, which maps the r numbers back to the 512 outputs, trains too.",
        4096: "that is B alone (512 x 8): A, which maps the 128 inputs to r numbers, trains too.",
        64: "r x r is not a shape LoRA trains: A is (r, in) and B is (out, r).",
        2048: "both matrices were counted with the input's size: B's rows are the layer's 512 outputs.",
        8192: "both matrices were counted with the output's size: A's columns are the layer's 128 inputs.",
        5632: "the bias (512) is part of the frozen layer: LoRA leaves it as it is.",
        524288: "r x in x out multiplies all three sizes: A and B are two matrices, (r, in) and (out, r); count each "
        "and add.",
        73728: "that is LoRA on all 24 layers of the model (printed a few cells on): the question is one layer, "
        "nn.Linear(128, 512).",
        "a str": "the count came back as a str: return it as an int.",
    },
)


# --- 2. build: the SFT loss on the response tokens ---------------------------------------------------


def _response_loss_reference(logits: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    log_probs = logits - logits.logsumexp(dim=-1, keepdim=True)  # (B, T, V): log-softmax
    losses = -log_probs.gather(-1, targets[..., None])[..., 0]  # (B, T): -log p(target) at every position
    counted = mask.to(losses.dtype)  # (B, T): 1 at response positions, 0 at prompt and padding
    return (losses * counted).sum() / counted.sum()  # every response token of the batch weighs the same


def _token_losses(logits, targets):  # noqa: ANN001, ANN202
    return -(logits - logits.logsumexp(dim=-1, keepdim=True)).gather(-1, targets[..., None])[..., 0]  # (B, T)


def _loss_all_positions(logits, targets, mask):  # noqa: ANN001, ANN202
    return _token_losses(logits, targets).mean()  # the prompt is learned too


def _loss_over_all_positions(logits, targets, mask):  # noqa: ANN001, ANN202
    return (_token_losses(logits, targets) * mask).sum() / mask.numel()  # masked, but divided by B T


def _loss_mean_of_rows(logits, targets, mask):  # noqa: ANN001, ANN202
    losses = _token_losses(logits, targets) * mask
    return (losses.sum(1) / mask.sum(1)).mean()  # each example's mean, then the mean of the examples


def _loss_prompt_only(logits, targets, mask):  # noqa: ANN001, ANN202
    losses = _token_losses(logits, targets)
    return (losses * ~mask).sum() / (~mask).sum()  # the mask read the other way round


def _loss_shifted_again(logits, targets, mask):  # noqa: ANN001, ANN202
    losses = _token_losses(logits[:, :-1], targets[:, 1:])  # the targets are already the next tokens
    kept = mask[:, 1:]
    return (losses * kept).sum() / kept.sum()


def _loss_summed(logits, targets, mask):  # noqa: ANN001, ANN202
    return (_token_losses(logits, targets) * mask).sum()  # never divided


def _loss_sum_per_row(logits, targets, mask):  # noqa: ANN001, ANN202
    return (_token_losses(logits, targets) * mask).sum(1).mean()  # each example's sum, then the mean over examples


def _loss_wrong_dimension(logits, targets, mask):  # noqa: ANN001, ANN202
    logp = logits - logits.logsumexp(dim=1, keepdim=True)  # normalised over the positions, not the vocabulary
    losses = -logp.gather(-1, targets[..., None])[..., 0]
    return (losses * mask).sum() / mask.sum()


def _loss_raw_logits(logits, targets, mask):  # noqa: ANN001, ANN202
    losses = -logits.gather(-1, targets[..., None])[..., 0]  # the logits taken as log-probabilities
    return (losses * mask).sum() / mask.sum()


def _loss_probabilities(logits, targets, mask):  # noqa: ANN001, ANN202
    losses = -logits.softmax(-1).gather(-1, targets[..., None])[..., 0]  # probabilities, no logarithm
    return (losses * mask).sum() / mask.sum()


def _loss_with_library(logits, targets, mask):  # noqa: ANN001, ANN202
    return finetune.response_loss(logits, targets, mask)


def _loss_case(name: str, batch: int, length: int, vocab: int, starts: list[int], ends: list[int], seed: int) -> Case:
    """Row i: prompt positions before starts[i], response from starts[i] to ends[i], padding after."""

    def inputs() -> tuple[Tensor, Tensor, Tensor]:
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(batch, length, vocab, generator=g, dtype=torch.float64) * 2  # (B, T, V)
        targets = torch.randint(0, vocab, (batch, length), generator=g)  # (B, T)
        positions = torch.arange(length)  # (T,)
        mask = (positions >= torch.tensor(starts)[:, None]) & (positions < torch.tensor(ends)[:, None])  # (B, T)
        return logits, targets, mask

    return Case(name, inputs, atol=1e-9, rtol=1e-6)


response_loss = Exercise(
    "response_loss",
    reference=_response_loss_reference,
    cases=[
        _loss_case("one example: 3 prompt positions, 4 response positions", 1, 7, 5, [3], [7], seed=130),
        _loss_case("two examples, responses of 4 and 2 tokens", 2, 7, 6, [3, 2], [7, 4], seed=131),
        _loss_case("a batch with padding after the shorter responses", 3, 9, 8, [2, 3, 4], [9, 6, 5], seed=132),
        _loss_case("the response is the last position only", 2, 6, 4, [5, 5], [6, 6], seed=133),
        _loss_case("a larger batch (B=4, T=12, V=30)", 4, 12, 30, [3, 5, 2, 6], [12, 9, 11, 8], seed=134),
    ],
    hints=[
        "Two steps: the loss of every position (minus the log-probability the logits give its target), then an "
        "average that counts only the positions where mask is True.",
        "log-probabilities: logits minus their logsumexp over the vocabulary; pick each target's entry with gather. "
        "The targets are already the next tokens (the format shifted them): do not shift again.",
        "Turn the mask into 0.0 and 1.0, multiply the (B, T) losses by it, add everything up, and divide by the "
        "number of response positions in the whole batch (not per example, and not B x T).",
    ],
    level="medium",
    kind="build",
    mistakes=[
        Mistake(
            _loss_all_positions,
            "every position was averaged, the prompt's included: the model would learn to write prompts too. Count "
            "only the positions where mask is True.",
        ),
        Mistake(
            _loss_over_all_positions,
            "the prompt positions' losses were zeroed, but the sum was divided by all B x T positions: the loss then "
            "shrinks when the prompts grow. Divide by the number of response positions.",
        ),
        Mistake(
            _loss_mean_of_rows,
            "each example's mean was taken first, then the mean of the examples: a token of a short response then "
            "weighs more than one of a long response. Here every response token of the batch weighs the same.",
        ),
        Mistake(
            _loss_prompt_only,
            "the mask was read the other way round: True marks the response positions, the ones the loss counts.",
        ),
        Mistake(
            _loss_shifted_again,
            "the logits and targets were shifted once more: targets[:, t] is already the token that follows "
            "position t (the format shifted them), so logits[:, t] scores targets[:, t] as they stand.",
        ),
        Mistake(
            _loss_sum_per_row,
            "each example's losses were added up, and only those sums averaged over the examples: the loss then "
            "grows with the responses' length. Divide by the number of response positions of the whole batch.",
        ),
        Mistake(
            _loss_summed,
            "the response positions' losses were added up but never divided: the loss would grow with the batch.",
        ),
        Mistake(
            _loss_wrong_dimension,
            "the log-probabilities were normalised over the positions (dim 1): a position's probabilities run over "
            "the vocabulary, the last dimension.",
        ),
        Mistake(
            _loss_raw_logits,
            "the logits were used as log-probabilities: turn them into log-probabilities over the vocabulary first "
            "(the logits minus their logsumexp). A cross-entropy is never negative.",
        ),
        Mistake(
            _loss_probabilities,
            "the probabilities were used where their logarithm belongs: the loss of a position is minus the "
            "log-probability of its target.",
        ),
    ],
    forbidden=[finetune.response_loss, finetune.token_logprobs],
    shortcuts=[_loss_with_library],
    run=_one_output,
    output_names=["your loss"],
)


# --- 3. debug: a LoRA layer's output and its merged weight -----------------------------------------


def _lora_forward_reference(
    x: Tensor, weight: Tensor, bias: Tensor, A: Tensor, B: Tensor, alpha: float
) -> tuple[Tensor, Tensor]:
    scale = alpha / A.shape[0]  # alpha / r: the rank is A's number of rows
    y = x @ weight.T + bias + scale * ((x @ A.T) @ B.T)  # (..., in) -> (..., r) -> (..., out)
    merged = weight + scale * (B @ A)  # (out, r) @ (r, in) -> (out, in), W's shape
    return y, merged


def _lora_as_given(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
    return x @ weight.T + bias + x @ A.T @ B.T, weight + A.T @ B.T  # the notebook's buggy version, unchanged


def _lora_no_scale(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
    return x @ weight.T + bias + (x @ A.T) @ B.T, weight + B @ A


def _lora_alpha_scale(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
    return x @ weight.T + bias + alpha * ((x @ A.T) @ B.T), weight + alpha * (B @ A)


def _lora_inverse_scale(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
    scale = A.shape[0] / alpha
    return x @ weight.T + bias + scale * ((x @ A.T) @ B.T), weight + scale * (B @ A)


def _lora_merge_transposed(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
    scale = alpha / A.shape[0]
    return x @ weight.T + bias + scale * ((x @ A.T) @ B.T), weight + scale * (A.T @ B.T)  # (in, out)


def _lora_merge_unscaled(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
    scale = alpha / A.shape[0]
    return x @ weight.T + bias + scale * ((x @ A.T) @ B.T), weight + B @ A


def _lora_no_bias(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
    scale = alpha / A.shape[0]
    return x @ weight.T + scale * ((x @ A.T) @ B.T), weight + scale * (B @ A)


def _lora_rank_from_b(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
    scale = alpha / B.shape[0]  # B's rows are the outputs, not the rank
    return x @ weight.T + bias + scale * ((x @ A.T) @ B.T), weight + scale * (B @ A)


def _lora_with_library(x, weight, bias, A, B, alpha):  # noqa: ANN001, ANN202
    base = torch.nn.Linear(weight.shape[1], weight.shape[0], dtype=weight.dtype)
    with torch.no_grad():
        base.weight.copy_(weight)
        base.bias.copy_(bias)
    layer = finetune.LoRALinear(base, rank=A.shape[0], alpha=alpha)
    with torch.no_grad():
        layer.lora_A.copy_(A)
        layer.lora_B.copy_(B)
        y = layer(x)
        layer.merge()
    return y, layer.base.weight.clone()


def _lora_case(
    name: str, shape: tuple[int, ...], fan_in: int, fan_out: int, rank: int, alpha: float, seed: int
) -> Case:
    def inputs() -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, float]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(*shape, fan_in, generator=g, dtype=torch.float64)  # (..., in)
        weight = torch.randn(fan_out, fan_in, generator=g, dtype=torch.float64) / fan_in**0.5  # (out, in)
        bias = torch.randn(fan_out, generator=g, dtype=torch.float64) * 0.1  # (out,)
        A = torch.randn(rank, fan_in, generator=g, dtype=torch.float64) / fan_in**0.5  # (r, in)
        B = torch.randn(fan_out, rank, generator=g, dtype=torch.float64) * 0.5  # (out, r): trained, so not zero
        return x, weight, bias, A, B, alpha

    return Case(name, inputs, atol=1e-9, rtol=1e-7)


lora_forward = Exercise(
    "lora_forward",
    reference=_lora_forward_reference,
    cases=[
        _lora_case("a square layer (in = out = 4), rank 2, alpha 3", (3,), 4, 4, 2, 3.0, seed=135),
        _lora_case("in = 6, out = 3, rank 1, alpha 2", (2,), 6, 3, 1, 2.0, seed=136),
        _lora_case("in = 5, out = 8, rank 4, alpha 6", (4,), 5, 8, 4, 6.0, seed=137),
        _lora_case("a (B, T, in) input: B = 2, T = 3; in = out = 6, rank 3, alpha 9", (2, 3), 6, 6, 3, 9.0, seed=138),
        _lora_case("alpha equal to the rank (scale 1): in = 4, out = 7, rank 2", (3,), 4, 7, 2, 2.0, seed=139),
    ],
    hints=[
        "Run the buggy version on the first case and on the second: why does the second fail while the first runs?",
        "The update is scaled by alpha / r, in the output and in the merged weight alike; r is LoRA's rank, "
        "A's number of rows. B A must have W's shape (out, in).",
        "Start with scale = alpha / A.shape[0]. Then mend the given function's two lines: the update needs that "
        "factor in y and in the merge alike, and the merge needs the product of A and B whose shape is W's.",
    ],
    level="medium",
    kind="debug",
    kind_title="debug the code",  # the bugs are in the code the chapter gives: the notes have no LoRA
    mistakes=[
        Mistake(
            _lora_as_given,
            "both bugs are still there: the update is not scaled, and the merge adds the transpose of B A, which "
            "runs only when the layer is square.",
        ),
        Mistake(
            _lora_no_scale,
            "the update was not scaled: LoRA multiplies B A by alpha / r, so that the learning rate need not be "
            "tuned again when the rank changes.",
        ),
        Mistake(
            _lora_alpha_scale,
            "the update was scaled by alpha alone: the factor is alpha / r, alpha divided by the rank.",
        ),
        Mistake(_lora_inverse_scale, "the update was scaled by r / alpha: the factor is alpha / r."),
        Mistake(
            _lora_rank_from_b,
            "the rank was read from a size of the layer (B's rows are its outputs, A's columns its inputs): the "
            "rank is A's number of rows (and B's number of columns).",
        ),
        Mistake(
            _lora_merge_transposed,
            "the merged update was A^T B^T, the transpose of B A: it has the shape (in, out), which only fits W "
            "(out, in) by chance when the layer is square. The merged weight is W + (alpha / r) B A.",
        ),
        Mistake(
            _lora_merge_unscaled,
            "the output was right but the merged weight forgot the factor alpha / r: merging must give the layer "
            "the same outputs as before.",
        ),
        Mistake(_lora_no_bias, "the layer's bias was dropped: LoRA leaves the frozen layer as it is, bias included."),
    ],
    forbidden=[finetune.LoRALinear, finetune.merge_lora, finetune.apply_lora],
    shortcuts=[_lora_with_library],
    output_names=["your output y", "your merged weight"],
)


# --- 4. build: group-relative advantages ------------------------------------------------------------


def _group_advantages_reference(rewards: Tensor) -> Tensor:
    baseline = rewards.mean(dim=1, keepdim=True)  # (P, 1): the mean reward of each prompt's own samples
    return rewards - baseline  # (P, G): above the group's mean > 0, below < 0


def _advantages_global_mean(rewards):  # noqa: ANN001, ANN202
    return rewards - rewards.mean()  # one baseline for the whole batch


def _advantages_across_prompts(rewards):  # noqa: ANN001, ANN202
    return rewards - rewards.mean(dim=0, keepdim=True)  # the mean over prompts, sample by sample


def _advantages_z_score(rewards):  # noqa: ANN001, ANN202
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return centred / (rewards.std(dim=1, keepdim=True) + 1e-4)  # GRPO's division, not asked for here


def _advantages_z_score_population(rewards):  # noqa: ANN001, ANN202
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return centred / (rewards.std(dim=1, keepdim=True, unbiased=False) + 1e-4)


def _advantages_raw(rewards):  # noqa: ANN001, ANN202
    return rewards.clone()  # no baseline: REINFORCE with the reward itself


def _advantages_max_baseline(rewards):  # noqa: ANN001, ANN202
    return rewards - rewards.max(dim=1, keepdim=True).values  # the best sample as baseline


def _advantages_leave_one_out(rewards):  # noqa: ANN001, ANN202
    group = rewards.shape[1]
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (group - 1)  # the mean of the OTHER samples
    return rewards - others


def _advantages_with_library(rewards):  # noqa: ANN001, ANN202
    return finetune.group_advantages(rewards)


def _rewards_case(name: str, rewards: list[list[float]]) -> Case:
    return Case(name, lambda: (torch.tensor(rewards, dtype=torch.float64),), atol=1e-9, rtol=1e-7, hidden="scale")


def _random_rewards_case(name: str, prompts: int, group: int, seed: int) -> Case:
    def inputs() -> tuple[Tensor]:
        g = torch.Generator().manual_seed(seed)
        return (torch.randint(0, 4, (prompts, group), generator=g).to(torch.float64) / 3,)  # 0, 1/3, 2/3 or 1

    return Case(name, inputs, atol=1e-9, rtol=1e-7, hidden="scale")


group_advantages = Exercise(
    "group_advantages",
    reference=_group_advantages_reference,
    cases=[
        _rewards_case("one prompt, four samples", [[1.0, 0.0, 0.5, 0.5]]),
        _rewards_case("two prompts, one easy and one hard", [[1.0, 1.0, 2 / 3, 1.0], [0.0, 1 / 3, 0.0, 0.0]]),
        _rewards_case("a group whose samples all score the same", [[2 / 3, 2 / 3, 2 / 3], [0.0, 1.0, 1 / 3]]),
        _rewards_case("as many prompts as samples (3 x 3)", [[0.0, 1.0, 1.0], [1 / 3, 1 / 3, 1.0], [1.0, 0.0, 0.0]]),
        _random_rewards_case("eight prompts, sixteen samples each", 8, 16, seed=140),
    ],
    hints=[
        "The baseline of a sample is the mean reward of the samples of ITS prompt (its group), one row of rewards.",
        "rewards is (P, G): one row per prompt. Which dimension does a row's mean run over? Keep it (keepdim) so that "
        "it broadcasts against the row.",
        "A row's mean, kept as a (P, 1) column, lines up with its row when the two meet in one operation: which "
        "one gives each sample's advantage? No division (that would be GRPO's z-score, a switch this exercise "
        "leaves off).",
    ],
    level="medium",
    kind="build",
    mistakes=[
        Mistake(
            _advantages_global_mean,
            "one mean over the whole batch was subtracted: an easy prompt's samples would all look good and a hard "
            "one's all bad. Each sample is compared with the other samples of its own prompt.",
        ),
        Mistake(
            _advantages_across_prompts,
            "the mean ran over the prompts (dim 0), sample by sample: a group is one ROW, the G samples of one prompt.",
        ),
        Mistake(
            _advantages_z_score,
            "the differences were divided by the group's standard deviation: that is GRPO's z-score, a switch this "
            "exercise (and nanochat) leaves off. Subtract the group's mean, and stop there.",
        ),
        Mistake(
            _advantages_z_score_population,
            "the differences were divided by a standard deviation: subtract the group's mean, and stop there.",
        ),
        Mistake(
            _advantages_raw,
            "the rewards came back unchanged: with no baseline, a group whose samples all score 1 would push all of "
            "them up, though none was better than another.",
        ),
        Mistake(
            _advantages_leave_one_out,
            "each sample's baseline left the sample itself out (RLOO's leave-one-out mean): here the baseline is the "
            "mean of the whole group, the sample included.",
        ),
        Mistake(
            _advantages_max_baseline,
            "the best sample of each group was the baseline: every advantage is then 0 or negative. The baseline is "
            "the group's mean.",
        ),
    ],
    forbidden=[finetune.group_advantages, finetune.policy_gradient_loss],
    shortcuts=[_advantages_with_library],
    run=_one_output,
    output_names=["your advantages"],
)


# --- 5. transfer: the reward of a 藏头诗 --------------------------------------------------------------


def _poem_reward_reference(text: str, heads: str) -> float:
    # form: four lines of five Chinese characters, "，" "。" "，" "。" after them, nothing else
    lines = [text[6 * i : 6 * i + 5] for i in range(4)]
    marks = [text[6 * i + 5 : 6 * i + 6] for i in range(4)]
    form = len(text) == 24 and marks == ["，", "。", "，", "。"]
    form = form and all("\u4e00" <= c <= "\u9fff" for line in lines for c in line)
    # acrostic and rhyme read the lines as the marks cut them, whatever their length
    pieces = text.replace("。", "，").split("，")
    if pieces[-1] == "" and text:
        pieces = pieces[:-1]  # the empty piece after the last mark
    acrostic = len(pieces) == 4 and all(p.startswith(h) for p, h in zip(pieces, heads, strict=True))
    rhyme = False
    if len(pieces) == 4 and pieces[1] and pieces[3]:
        second, fourth = finetune.rhyme_class(pieces[1][-1]), finetune.rhyme_class(pieces[3][-1])
        rhyme = second is not None and second == fourth  # one class of the table, not one final
    return (form + acrostic + rhyme) / 3  # the share of the three checks passed


def _pieces(text):  # noqa: ANN001, ANN202
    pieces = text.replace("。", "，").split("，")
    return pieces[:-1] if pieces[-1] == "" and text else pieces


def _form(text):  # noqa: ANN001, ANN202
    marks = [text[6 * i + 5 : 6 * i + 6] for i in range(4)]
    chars = [text[6 * i + j] for i in range(4) for j in range(5)] if len(text) == 24 else []
    return len(text) == 24 and marks == ["，", "。", "，", "。"] and all("\u4e00" <= c <= "\u9fff" for c in chars)


def _acrostic(text, heads):  # noqa: ANN001, ANN202
    pieces = _pieces(text)
    return len(pieces) == 4 and all(p.startswith(h) for p, h in zip(pieces, heads, strict=True))


def _rhyme(text):  # noqa: ANN001, ANN202
    pieces = _pieces(text)
    if len(pieces) != 4 or not pieces[1] or not pieces[3]:
        return False
    second, fourth = finetune.rhyme_class(pieces[1][-1]), finetune.rhyme_class(pieces[3][-1])
    return second is not None and second == fourth


def _reward_fixed_offsets(text, heads):  # noqa: ANN001, ANN202
    lines = [text[6 * i : 6 * i + 5] for i in range(4)]  # the lines where a quatrain in form has them
    acrostic = all(line[:1] == head for line, head in zip(lines, heads, strict=True))
    rhyme = False
    if lines[1] and lines[3]:
        second, fourth = finetune.rhyme_class(lines[1][-1]), finetune.rhyme_class(lines[3][-1])
        rhyme = second is not None and second == fourth
    return (_form(text) + acrostic + rhyme) / 3


def _reward_all_or_nothing(text, heads):  # noqa: ANN001, ANN202
    return float(_form(text) and _acrostic(text, heads) and _rhyme(text))  # 1 only when all three pass


def _reward_summed(text, heads):  # noqa: ANN001, ANN202
    return float(_form(text) + _acrostic(text, heads) + _rhyme(text))  # 0 to 3


def _reward_lines_one_three(text, heads):  # noqa: ANN001, ANN202
    pieces = _pieces(text)
    rhyme = len(pieces) == 4 and bool(pieces[0]) and bool(pieces[2])
    if rhyme:
        first, third = finetune.rhyme_class(pieces[0][-1]), finetune.rhyme_class(pieces[2][-1])
        rhyme = first is not None and first == third
    return (_form(text) + _acrostic(text, heads) + rhyme) / 3


def _reward_same_character(text, heads):  # noqa: ANN001, ANN202
    pieces = _pieces(text)
    rhyme = len(pieces) == 4 and bool(pieces[1]) and pieces[1][-1:] == pieces[3][-1:]
    return (_form(text) + _acrostic(text, heads) + rhyme) / 3


def _reward_exact_final(text, heads):  # noqa: ANN001, ANN202
    from pypinyin import Style, pinyin

    pieces = _pieces(text)
    rhyme = False
    if len(pieces) == 4 and pieces[1] and pieces[3]:
        second, fourth = (pinyin(p[-1], style=Style.FINALS, strict=True)[0][0] for p in (pieces[1], pieces[3]))
        rhyme = bool(second) and second == fourth
    return (_form(text) + _acrostic(text, heads) + rhyme) / 3


def _reward_any_marks(text, heads):  # noqa: ANN001, ANN202
    form = len(text) == 24 and all(text[6 * i + 5] in "，。" for i in range(4))  # which mark where, not checked
    form = form and all("\u4e00" <= text[6 * i + j] <= "\u9fff" for i in range(4) for j in range(5))
    return (form + _acrostic(text, heads) + _rhyme(text)) / 3


def _reward_any_characters(text, heads):  # noqa: ANN001, ANN202
    form = len(text) == 24 and [text[6 * i + 5] for i in range(4)] == ["，", "。", "，", "。"]  # letters pass
    return (form + _acrostic(text, heads) + _rhyme(text)) / 3


def _reward_empty_piece_kept(text, heads):  # noqa: ANN001, ANN202
    pieces = text.replace("。", "，").split("，")  # a quatrain gives 5 pieces: the last one empty
    acrostic = len(pieces) == 4 and all(p.startswith(h) for p, h in zip(pieces, heads, strict=True))
    rhyme = len(pieces) == 4 and _rhyme(text)
    return (_form(text) + acrostic + rhyme) / 3


def _reward_distinct_rhyme(text, heads):  # noqa: ANN001, ANN202
    pieces = _pieces(text)
    different = len(pieces) == 4 and pieces[1][-1:] != pieces[3][-1:]  # section 7's mended reward
    return (_form(text) + _acrostic(text, heads) + (_rhyme(text) and different)) / 3


def _reward_first_head_only(text, heads):  # noqa: ANN001, ANN202
    return (_form(text) + text.startswith(heads[0]) + _rhyme(text)) / 3


def _reward_with_library(text, heads):  # noqa: ANN001, ANN202
    return finetune.poem_reward(text, heads)


#: 孟浩然《春晓》: lines 2 and 4 end in 鸟 (niao) and 少 (shao), finals iao and ao, one class (豪)
CHUNXIAO = "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。"
#: 王之涣《登鹳雀楼》: 流 (liu, final iou) and 楼 (lou, ou), one class (尤); lines 1 and 3 end in 尽 and 目
DENGLOU = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"


#: the course's own lines: 绿 and 曲 (final v, class 齐) end lines 1 and 3; 红 (庚) and 寒 (寒) lines 2 and 4
NO_RHYME_24 = "春风吹柳绿，夏雨打荷红。秋月照山曲，冬雪落江寒。"
#: the course's own lines: 楼 (lou) and 头 (tou) have the same final; lines 1 and 3 end in 舟 (尤) and 至 (支)
LOU_TOU = "江上一孤舟，风吹过小楼。山中无客至，月色上枝头。"


#: characters a hidden case draws its poem's inner characters, heads and line-4 ending from (each has a class)
_DRAWN = (
    "山水风月花春秋天日云雨江人不一来无中有时何上下明清白青长高深远"
    "孤城门前归去夜寒烟草木树林鸟声落叶光色石松竹岸舟"
)
#: the visible cases' draw: with these very numbers the poem is the case's own; a graded class's hidden case
#: moves them ("noise", seeded by the submission's secret) and so draws another poem
_VISIBLE_DRAW = (0.25, 0.5, 0.75)


def _poem_case(name: str, text: str, heads: str) -> Case:
    return Case(name, lambda: (text, heads, torch.tensor(_VISIBLE_DRAW, dtype=torch.float64)), atol=1e-12, rtol=0)


def _drawn_poem(text: str, heads: str, draw: Tensor) -> tuple[str, str]:
    """The poem and heads a case asks about: its own for the visible draw; for a hidden case's (moved) draw,
    another of the same shape. Its inner characters and heads are drawn afresh (a head that matched still
    matches, one that did not still does not), and two times in three one change that can flip a check:
    another head asked for, another last character on line 4, or the marks after lines 1 and 2 swapped. So a
    table of the visible cases' answers is worth nothing in grading."""
    import hashlib
    import random
    import re

    values = tuple(float(v) for v in draw.tolist())  # plain floats: no tensor operator runs on the draw
    if values == _VISIBLE_DRAW:
        return text, heads
    rng = random.Random(hashlib.sha256(repr(values).encode()).digest())
    segments = re.split("([，。])", text)  # pieces at even indices, marks at odd ones
    pieces = [list(segments[k]) for k in range(0, len(segments), 2)]
    new_heads = list(heads)
    for i in range(len(heads)):
        fresh = rng.choice(_DRAWN)
        piece = pieces[i] if i < len(pieces) else []
        if piece and piece[0] == heads[i]:
            piece[0] = new_heads[i] = fresh  # asked for and given: still given
        else:
            new_heads[i] = rng.choice([c for c in _DRAWN if not piece or c != piece[0]])  # still not given
    for piece in pieces:
        for j in range(1, len(piece) - 1):  # the inner characters: neither a head nor a rhyme
            if "\u4e00" <= piece[j] <= "\u9fff":
                piece[j] = rng.choice(_DRAWN)
    change = rng.randrange(3) if rng.random() < 2 / 3 else None
    if change == 0:
        new_heads[rng.randrange(len(new_heads))] = rng.choice(_DRAWN)
    elif change == 1 and len(pieces) > 3 and pieces[3]:
        pieces[3][-1] = rng.choice(_DRAWN)
    elif change == 2 and len(segments) > 3:
        segments[1], segments[3] = segments[3], segments[1]
    for k, piece in zip(range(0, len(segments), 2), pieces, strict=True):
        segments[k] = "".join(piece)
    return "".join(segments), "".join(new_heads)


def _poem_run(candidate, text, heads, draw):  # noqa: ANN001, ANN202
    return (candidate(*_drawn_poem(text, heads, draw)),)  # a 1-tuple, so that the feedback names the reward


poem_reward = Exercise(
    "poem_reward",
    reference=_poem_reward_reference,
    cases=[
        _poem_case("lines 1 and 3 rhyme, lines 2 and 4 do not", NO_RHYME_24, "春夏秋冬"),
        _poem_case("lines 2 and 4 end in 楼 and 头 (one final, ou)", LOU_TOU, "江风山月"),
        _poem_case("《春晓》 with its own heads 春处夜花", CHUNXIAO, "春处夜花"),
        _poem_case("《春晓》 asked for the heads 春夏秋冬", CHUNXIAO, "春夏秋冬"),
        _poem_case("《登鹳雀楼》 with its own heads 白黄欲更", DENGLOU, "白黄欲更"),
        _poem_case("《春晓》 with 。 after every line", CHUNXIAO.replace("，", "。"), "春处夜花"),
        _poem_case(
            "lines 2 and 4 end in the same character", "山中一老僧，日日看山青。月下一声磬，风吹入山青。", "山日月风"
        ),
        _poem_case("a line of six characters", "白日依山尽，黄河入海奔流。欲穷千里目，更上一层楼。", "白黄欲更"),
        _poem_case("two lines only", "春眠不觉晓，处处闻啼鸟。", "春处夜花"),
        _poem_case(
            "lines ending in Latin letters, which have no rhyme class",
            "春眠不觉a，处处闻啼b。夜来风雨c，花落知多d。",
            "春处夜花",
        ),
        _poem_case("an empty line between two marks", "春眠不觉晓，，处处闻啼鸟。夜来风雨声，花落知多少。", "春处夜花"),
    ],
    hints=[
        "Three checks, each True or False: form, acrostic, rhyme. The reward is the share of them that pass (0, "
        "1/3, 2/3 or 1), so that a poem that gets two right scores above one that gets none.",
        "Form: exactly 24 characters, four lines of five Chinese characters, '，' '。' '，' '。' after them. For "
        "the other two checks cut the text at both marks: four pieces (the empty piece after the last mark is not a "
        "line: drop it, and only it), the i-th starting with heads[i] (acrostic).",
        "Rhyme: lines 2 and 4 (pieces[1] and pieces[3]) end in characters whose classes, "
        "tl.finetune.rhyme_class(char), are the same class and not None. Compare the classes, not the characters and "
        "not their exact finals.",
    ],
    level="harder",
    kind="transfer",
    mistakes=[
        Mistake(
            _reward_fixed_offsets,
            "acrostic and rhyme read the lines at fixed positions (text[6 i : 6 i + 5]): cut the text at the marks "
            "instead, so that a line of six characters still has its head and its last character.",
        ),
        Mistake(
            _reward_all_or_nothing,
            "the reward was 1 only when all three checks pass, 0 otherwise: a policy that has learned the form but "
            "not yet the rhyme then gets no signal. Give the share of the checks passed.",
        ),
        Mistake(
            _reward_summed,
            "the checks were added up (0 to 3): the reward is their share, between 0 and 1.",
        ),
        Mistake(
            _reward_exact_final,
            "the exact finals were compared (iao against ao): a rhyme ignores the medial (the i of iao), and the "
            "table groups the finals into classes. Compare the classes (rhyme_class).",
        ),
        Mistake(
            _reward_same_character,
            "the last characters themselves were compared: two different characters rhyme when their finals are in "
            "one class of the table (鸟 and 少 do).",
        ),
        Mistake(
            _reward_lines_one_three,
            "the rhyme was checked on lines 1 and 3: in a quatrain lines 2 and 4 rhyme (line 1 may too, line 3 "
            "usually does not).",
        ),
        Mistake(
            _reward_any_marks,
            "the form accepted either mark after any line: a quatrain alternates them, '，' after lines 1 and 3 and "
            "'。' after lines 2 and 4.",
        ),
        Mistake(
            _reward_first_head_only,
            "only the first line's head was checked: each of the four lines must begin with its own head.",
        ),
        Mistake(
            _reward_any_characters,
            "the form did not check that the lines are Chinese characters: a line of Latin letters is not in form.",
        ),
        Mistake(
            _reward_empty_piece_kept,
            "the text was cut at every mark and the empty piece after the last '。' was kept: a quatrain then has "
            "five pieces, so the acrostic and the rhyme never pass. Drop that empty piece (only the one after the "
            "last mark).",
        ),
        Mistake(
            _reward_distinct_rhyme,
            "a character rhyming with itself was not counted: that is section 7's mended reward "
            "(ft.poem_reward(..., distinct=True)). This exercise asks for section 1's check, in which it counts.",
        ),
    ],
    forbidden=[
        finetune.poem_reward,
        finetune.poem_checks,
        finetune.in_form,
        finetune.acrostic,
        finetune.rhymes,
        finetune.rhyme_reward,
        finetune.continuation_checks,
        finetune.poem_rates,
    ],
    shortcuts=[_reward_with_library],
    run=_poem_run,
    output_names=["your reward"],
)
