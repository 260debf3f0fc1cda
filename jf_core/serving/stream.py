"""One request's text as its tokens become final: incremental detokenization, stop strings and the token budget.

A server streams a completion chunk by chunk; what it sends must concatenate to exactly the text a non-streamed
call returns. Two things make that subtle:
- a token can end inside a multi-byte character (byte-level BPE), so the decoded text of a prefix may end in a
  replacement character that the next token completes: such a tail is held back;
- a stop string may begin in this chunk and end in a later one, so the last `len(longest stop) - 1` characters
  are held back until they cannot start a stop string.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

REPLACEMENT = "\ufffd"


@dataclass
class TextStream:
    tokenizer: object
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    eos: frozenset[int] = frozenset()
    tokens: list[int] = field(default_factory=list)
    sent: int = 0  # characters of the text already handed out
    finish_reason: Literal["stop", "length"] | None = None
    _text: str = ""

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        """The completion so far (final once `done`)."""
        return self._text

    def feed(self, new_tokens: list[int]) -> str:
        """Take newly final tokens; return the text that can be sent now (possibly empty)."""
        if self.done:
            return ""
        for token in new_tokens:
            if len(self.tokens) >= self.max_new_tokens:
                break
            self.tokens.append(token)
            if token in self.eos:
                self.finish_reason = "stop"
                break
        self._text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        cut = self._first_stop()
        if cut is not None:
            self._text, self.finish_reason = self._text[:cut], "stop"
        elif not self.done and len(self.tokens) >= self.max_new_tokens:
            self.finish_reason = "length"
        if self.done:
            return self._take(len(self._text))
        safe = len(self._text)
        if self._text.endswith(REPLACEMENT):  # an unfinished character: wait for the token that completes it
            safe = len(self._text.rstrip(REPLACEMENT))
        if self.stop:
            safe = min(safe, len(self._text) - (max(len(s) for s in self.stop) - 1))
        return self._take(max(safe, self.sent))

    def finish(self) -> str:
        """The decoder stopped (EOS or budget): send whatever was held back."""
        if self.finish_reason is None:
            self.finish_reason = "length"
        return self._take(len(self._text))

    def _first_stop(self) -> int | None:
        found = [i for i in (self._text.find(s) for s in self.stop if s) if i >= 0]
        return min(found) if found else None

    def _take(self, end: int) -> str:
        chunk = self._text[self.sent : end]
        self.sent = max(self.sent, end)
        return chunk
