"""How llama.cpp splits text before byte-level BPE, per ``tokenizer.ggml.pre``.

llama.cpp (``llama-vocab.cpp``) gives each pre-tokenizer name a list of regular expressions applied
in turn: each one cuts every piece so far into its matches and the text between them. That is what
a sequence of Hugging Face ``Split(pattern, behavior="isolated")`` steps does, so each entry here is
that list, written as the models' own ``tokenizer.json`` files write it. llama.cpp also decides per
name whether a piece that is itself a token skips the merges (``ignore_merges``).

Only names whose counts were compared with llama.cpp's on every case (its test vectors and varied
texts; see the vocabulary table in docs/counting.md) are listed. A name that is not here is refused, never
guessed: a guessed pattern is silently wrong on some texts, a refusal is a calibrated estimate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SplitRule:
    patterns: tuple[str, ...]
    # A piece that is one token in the vocabulary is that token, whatever the merges would make.
    ignore_merges: bool = False


# The contractions as llama.cpp spells Llama 3's and Qwen's case-insensitive group.
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Qwen 3.5/3.6 keep combining marks (\p{M}) with the letters they modify.
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# CJK ideographs, the block before them and Hangul: DeepSeek's tokenizers keep such runs whole.
# llama.cpp matches patterns written with literal ranges against a text whose non-ASCII spaces
# became \v, so a space inside a range (U+2009, U+3000) never matches it: ``&&[^\s]`` says so.
_DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff&&[^\\s]]+"
# The Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee ... letters DeepSeek LLM groups into words.
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)

SPLIT_RULES: dict[str, SplitRule] = {}


def _define(names: str, *patterns: str, ignore_merges: bool = False) -> None:
    for name in names.split():
        SPLIT_RULES[name] = SplitRule(patterns, ignore_merges)


_define("llama3 llama-v3 llama-bpe", _LLAMA3, ignore_merges=True)
_define("smaug-bpe dbrx", _LLAMA3)
# llama.cpp does not skip merges for Qwen's names, but on Qwen's vocabularies skipping changes no
# count (none of 2,082 texts of vocabulary words, nor the varied texts, measured against llama.cpp),
# while on the Ollama simulator's Qwen 3.6 vocabulary, whose merges are derived from tiktoken ranks,
# only skipping counts what tiktoken counts.
_define("qwen2 deepseek-r1-qwen", _QWEN2, ignore_merges=True)
_define("qwen35", _QWEN35, ignore_merges=True)
_define("gpt-2 mpt", _GPT2)
_define("starcoder refact command-r smollm", r"\p{N}", _GPT2)
_define("falcon", r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")
_DEEPSEEK_PUNCTUATION = "[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002&&[^\\s]]+"
_define(
    "deepseek-llm",
    "[\r\n]",
    rf"\s?[{_DEEPSEEK_LETTERS}]+",
    r"\s?" + _DEEPSEEK_PUNCTUATION,
    r"\s+$",
    _DEEPSEEK_CJK,
    r"\p{N}+",
)
_define("deepseek-coder", "[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DEEPSEEK_CJK, r"\p{N}")
# DeepSeek V3/R1: up to three digits, CJK and kana runs, then words with a leading punctuation mark.
_define(
    "deepseek-v3",
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# Upper-case runs and lower-case runs apart (CamelCase). llama.cpp writes "upper" as a letter that
# is not a-z and "lower" as one that is not A-Z, so every other script's letter is both, and this
# pattern says the same rather than tiktoken's \p{Lu}/\p{Ll}.
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
_CASED_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
_define(
    "tekken",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ignore_merges=True,
)
_define(
    "gpt-4o llama4",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CASED_CONTRACTIONS}"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CASED_CONTRACTIONS}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_define("chatglm-bpe", _LLAMA3)
_define("glm4", _LLAMA3, ignore_merges=True)
_define("falcon3 pixtral lfm2", _LLAMA3, ignore_merges=True)
_define("stablelm2", _QWEN2)
_define("olmo exaone4", _GPT2)
_define("exaone codeshell", r"\p{N}", _GPT2)
# No tokenizer.ggml.pre: llama.cpp's own default (punctuation runs, GPT-2's words, digit runs cut
# into threes). Old conversions (GPT-NeoX, Aquila) have none, and llama.cpp warns about them.
DEFAULT_RULE = SplitRule((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))
SPLIT_RULES["default"] = DEFAULT_RULE

# Further names llama.cpp gives one of the rules above.
_define("hunyuan megrez solar-open kormo f2llmv2", _QWEN2)
_define("minimax-m2 kanana2 talkie", *SPLIT_RULES["gpt-4o"].patterns)
_define("hunyuan-dense joyai-llm hy_v4", *SPLIT_RULES["deepseek-v3"].patterns)
_define("phi-2 jais trillion granite-docling gigachat a.x-4.0 mellum", _GPT2)
_define("minerva-7b mellum2", r"\p{N}", _GPT2)
_define("midm-2.0", _LLAMA3, ignore_merges=True)
# And names with patterns of their own.
_define("grok-2", _QWEN2)
_define("ufakzeka", r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_define(
    "seed-coder",
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
)
_define(
    "bailingmoe bailingmoe2 llada-moe",
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
)
_define(
    "exaone-moe",
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
)
_define("laguna", r"[^\n]+|[\n]+", _QWEN2)
_define("poro-chat bloom gpt3-finnish", r" ?[^(\s|.,!?…。，、।۔،)]+")
_define("viking", r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}")
# tiny_aya and cohere2moe are not listed: llama.cpp's digit grouping of its own and its letter cases
# (every letter outside ASCII both upper and lower) differ from the pattern on 17 of 1,338 texts.
_define(
    "jais-2",
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
    r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
)
_define(
    "minicpm5",
    r"\p{N}{1,3}",
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ignore_merges=True,
)
_define(
    "spark2_5",
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
    r"\p{N}",
)
