"""The embedded task's tokenizer: a genuine `Qwen2Tokenizer`, so no downstream code can tell it from a hub one.

transformers 5 rebuilds the tokenizer of any `qwen2` checkpoint as `Qwen2Tokenizer` (byte-level BPE behind Qwen2's
pre-tokenizer regex, which splits digits into single tokens), whatever `tokenizer_config.json` says. So the
vocabulary is trained here with exactly that pipeline: the 256 byte symbols plus BPE merges learned on the task's
own text, and Qwen2.5-Instruct's special tokens (`<|im_end|>` ends an answer, `<|endoftext|>` pads).
"""

from __future__ import annotations

import json

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2Tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from jf_core.toy.task import make_split

EOS, PAD = "<|im_end|>", "<|endoftext|>"

# The embedded model knows one kind of text, a program and its trace, and no dialogue: a chat is answered by giving it
# the last message, which must be the user's program (`/v1/chat/completions` and `jf decode --chat` then behave as
# completions of it). Anything else is refused by name rather than rendered into text the model never saw.
CHAT_TEMPLATE = (
    "{%- if not messages or messages[-1]['role'] != 'user' -%}"
    "{{ raise_exception('the embedded model answers a program: the last message must be the user\\'s') }}"
    "{%- endif -%}"
    "{{ messages[-1]['content'] }}"
)


def build_tokenizer(vocab_size: int = 400, corpus_size: int = 4000) -> Qwen2Tokenizer:
    """Deterministic: the corpus is the task's seeded train split."""
    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [f"{e.prompt} {e.answer}" for e in make_split("train", corpus_size)]
    core.train_from_iterator(texts, trainer=trainer)
    state = json.loads(core.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=state["vocab"], merges=merges, unk_token=None, eos_token=EOS, pad_token=PAD, padding_side="left"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
