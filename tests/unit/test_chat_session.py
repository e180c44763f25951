"""ChatSession: template deltas per model family, the seam, and segments where a template is
not prefix-stable (small templates modelled on the real ones: tests/unit/chat_templates.py)."""

from __future__ import annotations

import pytest
from chat_templates import (
    CHATML,
    CHATML_SPECIALS,
    GEMMA,
    GEMMA_SPECIALS,
    HERMES_TOOLS,
    LLAMA3,
    LLAMA3_SPECIALS,
    QWEN3_THINK,
)

from rollbank.chat.fake_tokenizer import SpecialTokenizer
from rollbank.chat.session import ChatSession
from rollbank.chat.template import ChatTemplate, prefix_stable
from rollbank.chat.tools import TOOLS

USER = [{"role": "system", "content": "Use the shell."}, {"role": "user", "content": "list files"}]


def _chatml() -> tuple[ChatTemplate, SpecialTokenizer]:
    return (ChatTemplate(CHATML, name="chatml"),
            SpecialTokenizer(CHATML_SPECIALS, bos="<|im_start|>", eos="<|im_end|>"))


def _model(s: ChatSession, tok: SpecialTokenizer, sampled: str, text: str, version: int = 3) -> list[int]:
    ids = tok.encode(sampled)
    s.append_model(ids, [-0.5] * len(ids), version, text)
    return ids


def _text(tok: SpecialTokenizer, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def test_chatml_delta_after_the_sampled_stop_token_is_only_the_templates_newline_and_new_turn() -> None:
    tpl, tok = _chatml()
    s = ChatSession(tpl, tok)
    first = s.start(USER)
    assert _text(tok, first) == tpl.render(USER, add_generation_prompt=True)
    model = _model(s, tok, "ls -la<|im_end|>", "ls -la")
    delta = s.extend([{"role": "tool", "content": "a b"}])
    assert _text(tok, delta) == "\n<|im_start|>tool\na b<|im_end|>\n<|im_start|>assistant\n"
    # one <|im_end|> per turn: the model's, not the template's a second time
    assert s.record.token_ids == first + model + delta
    assert s.record.loss_mask == [0] * len(first) + [1] * len(model) + [0] * len(delta)
    assert s.record.versions[len(first):len(first) + len(model)] == [3] * len(model)
    assert _text(tok, s.record.token_ids) == tpl.render(s.messages, add_generation_prompt=True)
    assert s.prompt_token_ids == s.record.token_ids and len(s.segments) == 1


def test_chatml_turn_cut_by_max_tokens_gets_the_whole_end_of_turn() -> None:
    tpl, tok = _chatml()
    s = ChatSession(tpl, tok)
    s.start(USER)
    _model(s, tok, "ls -l", "ls -l")  # no stop token sampled
    delta = s.extend([{"role": "tool", "content": "x"}])
    assert _text(tok, delta).startswith("<|im_end|>\n<|im_start|>tool\n")


def test_hermes_tools_slot_renders_the_schemas_and_deltas_stay_exact() -> None:
    tpl = ChatTemplate(HERMES_TOOLS)
    tok = SpecialTokenizer(CHATML_SPECIALS, bos="<|im_start|>", eos="<|im_end|>")
    assert tpl.supports_tools and not ChatTemplate(CHATML).supports_tools
    s = ChatSession(tpl, tok)
    first = s.start(USER, tools=TOOLS)
    assert '"name": "shell"' in _text(tok, first)
    _model(s, tok, '<tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call><|im_end|>',
           '<tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call>')
    s.extend([{"role": "tool", "content": "ok"}])
    assert _text(tok, s.record.token_ids) == tpl.render(s.messages, tools=TOOLS, add_generation_prompt=True)


def test_gemma_trims_the_models_text_the_seam_keeps_the_sampled_ids_and_adds_only_framing() -> None:
    tpl = ChatTemplate(GEMMA, bos_token="<s>")
    tok = SpecialTokenizer(GEMMA_SPECIALS)
    s = ChatSession(tpl, tok)
    first = s.start(USER)
    assert _text(tok, first).startswith("<s><start_of_turn>user\nUse the shell.\n\nlist files")
    model = _model(s, tok, "ls  \n<end_of_turn>", "ls  \n")
    delta = s.extend([{"role": "user", "content": "out"}])
    assert _text(tok, delta) == "\n<start_of_turn>user\nout<end_of_turn>\n<start_of_turn>model\n"
    assert s.record.token_ids == first + model + delta  # the sampled ids are untouched
    assert [e["event"] for e in s.events] == ["seam_rewritten"]
    # a re-render would have dropped the model's trailing spaces: recorded != re-tokenised
    assert tok.encode(tpl.render(s.messages, add_generation_prompt=True)) != s.record.token_ids


def test_llama3_eot_is_not_doubled_and_tool_results_use_the_ipython_role() -> None:
    tpl = ChatTemplate(LLAMA3, bos_token="<|begin_of_text|>")
    tok = SpecialTokenizer(LLAMA3_SPECIALS, bos="<|begin_of_text|>", eos="<|eot_id|>")
    s = ChatSession(tpl, tok)
    s.start(USER, tools=TOOLS)
    _model(s, tok, '{"name": "shell", "parameters": {"command": "ls"}}<|eot_id|>',
           '{"name": "shell", "parameters": {"command": "ls"}}')
    delta = s.extend([{"role": "tool", "content": "a"}])
    assert _text(tok, delta) == ("<|start_header_id|>ipython<|end_header_id|>\n\na<|eot_id|>"
                                 "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert _text(tok, s.record.token_ids).count("<|eot_id|>") == 4  # system, user, model, tool


def test_qwen3_style_template_is_not_prefix_stable_and_gets_an_explicit_segment() -> None:
    tpl = ChatTemplate(QWEN3_THINK)
    tok = SpecialTokenizer(CHATML_SPECIALS, bos="<|im_start|>", eos="<|im_end|>")
    report = prefix_stable(tpl)
    assert not report.stable and report.first_break == 5 and "<think>" in report.before
    s = ChatSession(tpl, tok)
    p0 = len(s.start(USER))
    m1 = _model(s, tok, "<think>look first</think>\nls<|im_end|>", "<think>look first</think>\nls")
    s.extend([{"role": "tool", "content": "a"}])  # a tool result is not a user query: stable
    assert len(s.segments) == 1
    _model(s, tok, "done<|im_end|>", "done", version=4)
    before = list(s.record.token_ids)
    new_prompt = s.extend([{"role": "user", "content": "and now?"}])
    assert [seg.reason for seg in s.segments] == ["start", "template_rewrites_history"]
    seg = s.segments[1]
    assert seg.start == len(before) and seg.prompt_len == len(new_prompt)
    assert s.record.token_ids[: len(before)] == before  # nothing recorded was re-tokenised
    assert "<think>" not in _text(tok, new_prompt)  # the template dropped past reasoning
    assert s.prompt_token_ids == new_prompt  # the engine sees the new segment only
    assert s.record.token_ids[p0:p0 + len(m1)] == m1  # the sampled reasoning stays recorded
    assert s.events[-1]["reason"] == "template_rewrites_history"


@pytest.mark.parametrize(("source", "stable"), [(CHATML, True), (HERMES_TOOLS, True), (GEMMA, True),
                                                (LLAMA3, True), (QWEN3_THINK, False)])
def test_prefix_probe_per_family(source: str, stable: bool) -> None:
    assert prefix_stable(ChatTemplate(source)).stable is stable


@pytest.mark.parametrize("source", [CHATML, HERMES_TOOLS, GEMMA, LLAMA3, QWEN3_THINK])
def test_transformers_rendering_equals_the_jinja_fallback(source: str) -> None:
    msgs = [*USER, {"role": "assistant", "content": "<think>x</think>\n ls "},
            {"role": "tool", "content": "a"}, {"role": "user", "content": "b"}]
    a = ChatTemplate(source, bos_token="<s>").render(msgs, tools=TOOLS, add_generation_prompt=True)
    b = ChatTemplate(source, bos_token="<s>", use_transformers=False).render(
        msgs, tools=TOOLS, add_generation_prompt=True)
    assert a == b


def test_match_prefix_counts_the_held_messages_a_resent_history_starts_with() -> None:
    tpl, tok = _chatml()
    s = ChatSession(tpl, tok)
    s.start(USER)
    _model(s, tok, "ls<|im_end|>", "ls")
    s.extend([{"role": "tool", "content": "a"}])
    held = list(s.messages)
    assert s.match_prefix(held) == 4
    assert s.match_prefix([*held, {"role": "user", "content": "more"}]) == 4
    assert s.match_prefix([held[0], {"role": "user", "content": "edited"}]) == 1
    assert s.match_prefix([]) == 0


def test_restart_records_a_named_segment_for_an_edited_history() -> None:
    tpl, tok = _chatml()
    s = ChatSession(tpl, tok)
    s.start(USER)
    _model(s, tok, "ls<|im_end|>", "ls")
    n = s.total_tokens
    ids = s.restart([USER[0], {"role": "user", "content": "summary"}], "history_edit")
    assert s.segments[-1].start == n and s.segments[-1].reason == "history_edit"
    assert s.prompt_token_ids == ids and s.total_tokens == n + len(ids)


def test_template_error_is_a_config_error() -> None:
    from rollbank.errors import ConfigError

    tpl = ChatTemplate("{{ raise_exception('no tools here') }}", name="bad")
    with pytest.raises(ConfigError, match="no tools here"):
        tpl.render(USER, add_generation_prompt=True)
