"""llama.cpp's own tokenizer test data, fetched from PyPI into a cache outside the repository.

llama.cpp ships vocab-only GGUF files (``models/ggml-vocab-*.gguf``) with test vectors: ``.inp``
holds texts separated by ``__ggml_vocab_test__`` lines and ``.out`` one line of token ids per text,
produced by each model's reference tokenizer and checked against llama.cpp by its own tests. They
travel inside the llama.cpp sources that PyPI sdists vendor, so the source distribution of
``llama-cpp-python`` (pinned: the vectors must not move under the tests) is downloaded once per
machine with pip and only those files are kept.

``model_info`` turns a GGUF file into the fields Ollama's ``/api/show`` (verbose) gives, so a
vocabulary here is read by the same code as a model Ollama serves.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# llama.cpp as vendored in this release (upstream build of 2026-10).
SDIST = "llama-cpp-python==0.3.36"
MODELS_IN_SDIST = "/vendor/llama.cpp/models/"
VOCAB_PREFIX = "ggml-vocab-"
SEPARATOR = "\n__ggml_vocab_test__\n"
# Ollama's model_info carries the tokenizer's fields and the model's general ones (general.name
# decides phi-3's token attributes in llama.cpp).
INFO_PREFIXES = ("tokenizer.ggml.", "general.name")
DOWNLOAD_TIMEOUT_S = 600
# What pip prints when it cannot reach the index (no network, DNS, proxy, TLS).
_NETWORK_FAILURES = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                     "Name or service not known", "ConnectTimeout", "ReadTimeout", "ProxyError", "SSLError",
                     "Network is unreachable", "Connection refused")


class OracleUnavailable(RuntimeError):
    """PyPI could not be reached: the caller skips, saying so."""


def cache_root() -> Path:
    """``PALIMPSEST_VOCAB_CACHE``, else ``~/.cache/palimpsest-vocab``: never inside the repository."""
    configured = os.environ.get("PALIMPSEST_VOCAB_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "palimpsest-vocab"


def vocab_dir(root: Path | None = None) -> Path:
    """The folder of llama.cpp's vocab files and vectors, downloaded on first use.

    Parallel-safe: test workers take a file lock, the first downloads, the others find it done;
    the folder appears whole (renamed into place) or not at all."""
    root = root or cache_root()
    target = root / SDIST.replace("==", "-")
    if (target / ".complete").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").is_file():
            _download(target)
    return target


def _download(target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--disable-pip-version-check", "--retries", "1", "--timeout", "30", "-d", scratch, SDIST]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise OracleUnavailable(f"pip download {SDIST} timed out") from exc
        archives = list(Path(scratch).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            why = f"pip download {SDIST} failed: {done.stderr.strip()[-400:]}"
            # Only an unreachable index is a reason to skip; any other failure is the test's.
            if any(sign in done.stderr for sign in _NETWORK_FAILURES):
                raise OracleUnavailable(why)
            raise RuntimeError(why)
        staged = Path(scratch) / "models"
        staged.mkdir()
        with tarfile.open(archives[0]) as archive:
            for member in archive.getmembers():
                name = member.name.rpartition("/")[2]
                if member.isfile() and MODELS_IN_SDIST in member.name and name.startswith(VOCAB_PREFIX):
                    source = archive.extractfile(member)
                    assert source is not None
                    with source, open(staged / name, "wb") as out:
                        shutil.copyfileobj(source, out)
        (staged / ".complete").write_text(SDIST)
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)


@dataclass(frozen=True)
class OracleVocab:
    """One of llama.cpp's vocab files and its test vectors (none for some)."""

    name: str  # e.g. "llama-bpe", from ggml-vocab-llama-bpe.gguf
    path: Path

    @property
    def has_vectors(self) -> bool:
        return self.path.with_name(self.path.name + ".inp").is_file()

    def vectors(self) -> list[tuple[str, list[int]]]:
        """(text, expected ids) pairs, read the way llama.cpp's test-tokenizer-0 reads them."""
        raw = self.path.with_name(self.path.name + ".inp").read_text(encoding="utf-8")
        texts: list[str] = []
        position = 0
        while position < len(raw):
            found = raw.find(SEPARATOR, position)
            if found < 0:
                texts.append(raw[position:])
                break
            texts.append(raw[position:found])
            position = found + len(SEPARATOR)
        lines = self.path.with_name(self.path.name + ".out").read_text(encoding="utf-8").splitlines()
        if len(lines) != len(texts):
            raise ValueError(f"{self.name}: {len(texts)} texts but {len(lines)} lines of ids")
        return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, lines)]


def vocabularies(folder: Path) -> list[OracleVocab]:
    return [OracleVocab(p.name[len(VOCAB_PREFIX):-len(".gguf")], p)
            for p in sorted(folder.glob(VOCAB_PREFIX + "*.gguf"))]


# GGUF value types: (struct format, size) for scalars; 8 is a string, 9 an array.
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
            6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_STRING, _ARRAY = 8, 9


class _Reader:
    """The key-value header of a GGUF file (the format's spec, little-endian); tensors are not read."""

    def __init__(self, data: bytes):
        self.data = data
        self.at = 0

    def scalar(self, kind: int) -> Any:
        fmt, size = _SCALARS[kind]
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        length = self.scalar(10)
        text = self.data[self.at:self.at + length].decode("utf-8", "surrogateescape")
        self.at += length
        return text

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.scalar(4), self.scalar(10)
            if item_kind in _SCALARS:  # one unpack for the whole array
                fmt, size = _SCALARS[item_kind]
                values = struct.unpack_from(f"<{count}{fmt[1]}", self.data, self.at)
                self.at += size * count
                return list(values)
            return [self.value(item_kind) for _ in range(count)]
        return self.scalar(kind)


def model_info(path: Path) -> dict[str, Any]:
    """The GGUF file's tokenizer fields as Ollama's ``model_info`` (verbose) gives them."""
    reader = _Reader(path.read_bytes())
    if reader.data[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    reader.at = 8  # magic and version
    _tensors, pairs = reader.scalar(10), reader.scalar(10)
    info: dict[str, Any] = {}
    for _ in range(pairs):
        key = reader.string()
        value = reader.value(reader.scalar(4))
        if key.startswith(INFO_PREFIXES) and key != "tokenizer.chat_template":
            info[key] = value
    return info


# -- our own texts, counted by llama.cpp itself -------------------------------------------------

# The kinds of text whose tokens differ most between split rules: prose, code, JSON, dense logs,
# scripts with and without spaces, combining marks, emoji sequences, runs of every whitespace,
# digits in every grouping, and the characters regexes disagree on (NBSP, NEL, separators).
VARIED_TEXTS = [
    "The quick brown fox jumps over the lazy dog; it's what they'd've done, isn't it? I'LL SEE. We'Ve 'S",
    "In 2026, the committee approved $1,234,567.89 for 3 projects — roughly 12.5% of the budget.",
    "def handler(event, context):\n    if not event:\n\treturn None\n    return {'status': 200, 'body': event['body']}\n",
    "for (let i = 0; i < n; i++) { total += arr[i] ** 2; } // O(n)\n#include <stdio.h>\nint main(){return 0;}",
    '{"id": 17, "name": "palimpsest", "tags": ["a", "b"], "nested": {"ok": true, "pi": 3.14159, "n": null}}',
    "2026-11-30T10:14:37.123Z ERROR [worker-3] conn reset by peer 10.0.0.7:5432 id=8f3a9c0d4e5f trace=0xDEADBEEF",
    "GET /api/v1/sessions/4f1c2a?limit=50&after_seq=41 HTTP/1.1\r\nHost: localhost:8080\r\n\r\n",
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total > 100 GROUP BY u.id;",
    "中文测试，日本語のテキスト、한국어 텍스트。混合English和中文123个字符！",
    "Привет, мир! Ελληνικά κείμενα. Հայերեն. ქართული. Ünïcödé façade naïve coöperate.",
    "नमस्ते दुनिया। ภาษาไทยไม่มีช่องว่าง العربية من اليمين إلى اليسار עברית",
    "e\u0301 a\u0308 n\u0303 \u1100\u1161\u11a8 q\u0323\u0307 \u0915\u094d\u0937",
    "emoji 🎉 ok 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️‍🔥 😶‍🌫️ 🦙.cpp ✅ 🧑🏿‍💻",
    "   leading spaces\t\ttabs\n\n\nthree newlines\r\n\r\nwindows  \n  \n\t \n trailing   ",
    "\n", " ", "  ", "\t", "\n\n\n\n\n\n\n\n", "a\n\n\n\n\nb", "x" + " " * 40 + "y", "\u00a0\u00a0nbsp\u3000ideographic\u2009thin",
    "line\u0085next\u2028sep\u2029para\x0bvt\x0cff\x1cfs\x1dgs\x1ers\x1fus end",
    "3 33 333 3333 33333 333333 3333333 33333333 123456789012345678901234567890 0.000001 1e-9 ٣٤٥ ¹²³ ½ Ⅻ",
    "| col | value |\n|-----|-------|\n| a   | 1     |\n\n> quote\n- item\n* item\n```python\nprint('x')\n```",
    "https://example.com/path/to/file.tar.gz?x=1#frag user@example.org C:\\Users\\me\\file.txt ../../etc/passwd",
    "aGVsbG8gd29ybGQgdGhpcyBpcyBiYXNlNjQ= 0x7fffffff 0b1010 0o755 #ff00aa rgba(0,0,0,.5)",
    "!!!??? ... --- *** ___ ~~~ ^^^ ||| &&& <<<>>> === +++ %%% $$$ ### @@@ ``` ''' \"\"\" ((())) [[[]]] {{{}}}",
    "ＦＵＬＬＷＩＤＴＨ　ｔｅｘｔ！１２３ ＡＢＣ「」『』【】〈〉《》・ー～",
    "∀x∈ℝ: x²≥0 ∑ᵢ aᵢ ≈ ∫f(x)dx ≠ ∞ ⊂ ⊆ ∧ ∨ ¬ → ⇒ ⟨ψ|φ⟩ ℏω €£¥₹₿ ©®™ °C",
    "Hello world Hello World  Hello\tWorld\nHello, world! HELLO WORLD hello_world helloWorld HelloWORLD",
    "it's IT'S It'S they're THEY'RE we've WE'VE i'm I'M you'll YOU'LL he'd HE'D 's 't 're",
]


def random_texts(seed: int, count: int) -> list[str]:
    """Random strings over an alphabet that crosses every character class the patterns name."""
    rnd = random.Random(seed)
    pool = [*map(chr, range(32, 127)), *"\n\n\n\t\r  ", *"éüßøÆœçñ", "e\u0301", *"中文日本語한국어",
            *"кириллицаΕλληνικά", *"١٢٣٣४५६", *"¹½Ⅻ", *"🎉👍🏽🦙", "\u200d", "\u00a0", "\u3000", "\u2009", "\u0085",
            *"，。！？「」", *"∑∞≠€©°", *"\u0915\u094d\u0937", *"ภาษา", *"ＡＢ１２"]
    return ["".join(rnd.choice(pool) for _ in range(rnd.randint(1, 120))) for _ in range(count)]


def special_texts(specials: list[str], seed: int) -> list[str]:
    """Texts with a vocabulary's own special tokens inside words, at edges and doubled."""
    rnd = random.Random(seed)
    picked = rnd.sample(specials, min(12, len(specials))) if specials else []
    texts = []
    for i, token in enumerate(picked):
        texts += [token, f"a{token}b", f" {token} \n", f"{token}{token}", f"Hi {token}\n\nthere  {token}x"]
        if i % 3 == 0:
            texts.append(f"{token}user\nWhat is 2+2?{token}\n{token}assistant\n")
    return texts


def texts_for(info: dict[str, Any]) -> list[str]:
    from services.compressor.special_tokens import matched_tokens

    tokens = info.get("tokenizer.ggml.tokens") or []
    types = info.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    specials = [m.text for m in matched_tokens(tokens, types, str(info.get("general.name") or ""))]
    return [*VARIED_TEXTS, *random_texts(25, 300), *special_texts(specials, 7)]


# -- the cases: llama.cpp's vocab files, and other pre-tokenizer names on a proxy vocabulary -------

# Embedding-only vocabularies (WordPiece, Unigram): never a chat prompt, so not counted.
EMBEDDING_ONLY = ("bert-bge", "nomic-bert-moe")
# Names llama.cpp knows that have no vocab file of their own: checked on a vocabulary relabelled
# with the name (llama.cpp loads it with a tokenizer.ggml.pre override). Names where a piece that is
# a token skips the merges get Llama 3's vocabulary, whose merges do not rebuild every token.
RELABELLED = {
    "gpt-2": ("deepseek-v3", "gpt-4o", "llama4", "smollm", "chatglm-bpe", "stablelm2", "olmo", "exaone",
              "exaone4", "codeshell", "smaug-bpe", "dbrx", "deepseek-r1-qwen"),
    "llama-bpe": ("tekken", "glm4", "llama3", "llama-v3", "falcon3", "pixtral", "lfm2", "gpt-4o", "deepseek-v3"),
}
DATA = Path(__file__).parent / "data" / "vocab_llamacpp_counts.json"


def cases(folder_names: list[str]) -> dict[str, tuple[str, str | None]]:
    """Case name -> (vocab file name, pre override)."""
    found = {name: (name, None) for name in folder_names if name not in EMBEDDING_ONLY}
    for proxy, names in RELABELLED.items():
        found.update({f"{pre}@{proxy}": (proxy, pre) for pre in names})
    return found


def relabelled(info: dict[str, Any], pre: str | None) -> dict[str, Any]:
    return info if pre is None else {**info, "tokenizer.ggml.pre": pre}


def llama_cpp_ids(driver: Path, gguf: Path, pre: str | None, texts: list[str]) -> list[list[int]]:
    """llama.cpp's ids for each text: llama_tokenize(add_special=false, parse_special=true), what
    llama-server does to a prompt less the BOS; ``driver`` is llamacpp_tokenize.cpp built."""
    payload = "\0".join(texts).encode("utf-8")
    done = subprocess.run([str(driver), str(gguf), pre or "", "1"], input=payload, capture_output=True,
                          check=True, timeout=600)
    lines = done.stdout.decode().split("\n")[:len(texts)]
    return [[int(i) for i in line.split()] for line in lines]


def regenerate(driver: Path) -> None:
    """Counts every case's texts with llama.cpp and writes DATA (run by hand when cases change)."""
    folder = vocab_dir()
    names = [v.name for v in vocabularies(folder)]
    common = [*VARIED_TEXTS, *random_texts(25, 300)]
    data: dict[str, Any] = {"llama_cpp": SDIST, "cases": {}, "counts": {}, "common_texts": common,
                            "special_texts": {}}
    for case, (vocab, pre) in cases(names).items():
        data["cases"][case] = [vocab, pre]
        gguf = folder / f"{VOCAB_PREFIX}{vocab}.gguf"
        info = relabelled(model_info(gguf), pre)
        special = data["special_texts"].setdefault(vocab, texts_for(info)[len(VARIED_TEXTS) + 300:])
        data["counts"][case] = [len(ids) for ids in llama_cpp_ids(driver, gguf, pre, [*common, *special])]
        print(case, sum(data["counts"][case]), file=sys.stderr)
    DATA.write_text(_one_entry_a_line(data), encoding="utf-8")


def _one_entry_a_line(data: dict[str, Any]) -> str:
    """JSON a reviewer can diff: each case's counts, each text, on a line of its own."""
    def block(value: Any) -> str:
        if isinstance(value, dict):
            return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                                      for k, v in value.items()) + "\n }"
        if isinstance(value, list):
            return "[\n" + ",\n".join(f"  {json.dumps(v, ensure_ascii=False)}" for v in value) + "\n ]"
        return json.dumps(value)
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {block(v)}" for k, v in data.items()) + "\n}\n"


def table() -> str:
    """The README's table: per case, the cases checked and how many counts equal llama.cpp's."""
    from services.compressor.vocabulary import UnsupportedVocabulary, build_tokenizer

    folder = vocab_dir()
    data = json.loads(DATA.read_text(encoding="utf-8"))
    rows = ["| vocabulary (`tokenizer.ggml.pre`) | llama.cpp's vectors: counts equal | our texts: counts equal "
            "| counted |", "|---|---|---|---|"]
    for vocab in EMBEDDING_ONLY:
        kind = model_info(folder / f"{VOCAB_PREFIX}{vocab}.gguf")["tokenizer.ggml.model"]
        rows.append(f"| {vocab} (`{kind}`) | – | – | refused: embedding-only model kind |")
    for case, (vocab, pre) in data["cases"].items():
        info = relabelled(model_info(folder / f"{VOCAB_PREFIX}{vocab}.gguf"), pre)
        label = f"{case} (`{info.get('tokenizer.ggml.pre') or info['tokenizer.ggml.model']}`)"
        try:
            tokenizer = build_tokenizer(info)
        except UnsupportedVocabulary as exc:
            rows.append(f"| {label} | – | – | refused: {exc} |")
            continue
        oracle = OracleVocab(vocab, folder / f"{VOCAB_PREFIX}{vocab}.gguf")
        vectors = "–"
        if pre is None and oracle.has_vectors:
            pairs = oracle.vectors()
            equal = sum(len(tokenizer.encode(t, add_special_tokens=False).ids) == len(ids) for t, ids in pairs)
            vectors = f"{equal} of {len(pairs)}"
        texts = [*data["common_texts"], *data["special_texts"][vocab]]
        counts = [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
        equal = sum(a == b for a, b in zip(counts, data["counts"][case]))
        verdict = "exact" if equal == len(texts) and not vectors.startswith("–") or equal == len(texts) else "wrong"
        rows.append(f"| {label} | {vectors} | {equal} of {len(texts)} | {verdict} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table() if sys.argv[1:] == ["--table"] else regenerate(Path(sys.argv[1])))
