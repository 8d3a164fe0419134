"""The demo model's byte-level BPE tokenizer and chat template.

Training uses the ``tokenizers`` library's BPE trainer, which is deterministic for a given
corpus (merge ties are broken by pair order; checked by the determinism tests).
"""

from __future__ import annotations

from typing import Final

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

END: Final = "<|end|>"
SYSTEM: Final = "<|system|>"
USER: Final = "<|user|>"
ASSISTANT: Final = "<|assistant|>"
TOOL: Final = "<|tool|>"
PAD: Final = "<|pad|>"

#: Special tokens in id order: ``<|end|>`` is id 0 and is the EOS token.
SPECIAL_TOKENS: Final = (END, SYSTEM, USER, ASSISTANT, TOOL, PAD)
ROLE_TOKENS: Final = (SYSTEM, USER, ASSISTANT, TOOL)

# One line per message: "<|role|>\n{content}<|end|>\n"; the generation prompt is
# "<|assistant|>\n". Content may be a string or a list of OpenAI-style parts (text parts are
# concatenated, others ignored); "developer" is treated as "system"; other roles are rejected.
CHAT_TEMPLATE: Final = (
    "{%- for message in messages -%}"
    "{%- set role = message['role'] -%}"
    "{%- if role == 'developer' -%}{%- set role = 'system' -%}{%- endif -%}"
    "{%- if role not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{- raise_exception('skulk-demo: unsupported message role ' + role) -}}"
    "{%- endif -%}"
    "{{- '<|' + role + '|>\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


def train_tokenizer(paragraphs: tuple[str, ...], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE tokenizer (GPT-2 style pre-split, no prefix space)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(paragraphs), trainer=trainer)
    for index, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != index:
            raise AssertionError(f"special token {token} did not get id {index}")
    return tokenizer


def tokenizer_config(max_length: int) -> dict[str, object]:
    """Contents of ``tokenizer_config.json`` (read by transformers / mlx-lm)."""
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": END,
        "model_max_length": max_length,
        "pad_token": PAD,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def special_tokens_map() -> dict[str, object]:
    """Contents of ``special_tokens_map.json``."""
    return {"eos_token": END, "pad_token": PAD}
