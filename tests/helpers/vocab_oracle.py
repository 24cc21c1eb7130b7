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
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ollama_sim import gguf

# llama.cpp as vendored in this release (upstream build of 2026-10).
SDIST = "llama-cpp-python==0.3.36"
# Mistral's own SentencePiece vocabularies (Mistral 7B v0.3, Mistral Large 2411), in the wheel of
# Mistral's tokenizer library; llama.cpp's counts of them were made from the GGUF its converter
# writes (tokens, scores, types, add_space_prefix), which spm_model_info gives too.
MISTRAL_WHEEL = "mistral-common==1.13.1"
SPM_FILES = {
    "mistral-v3": "mistral_instruct_tokenizer_240323.model.v3",
    "mistral-v7": "mistral_instruct_tokenizer_241114.model.v7",
}
MODELS_IN_SDIST = "/vendor/llama.cpp/models/"
VOCAB_PREFIX = "ggml-vocab-"
SEPARATOR = "\n__ggml_vocab_test__\n"
DOWNLOAD_TIMEOUT_S = 600
# What pip prints when it cannot reach the index (no network, DNS, proxy, TLS).
_NETWORK_FAILURES = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Name or service not known",
    "ConnectTimeout",
    "ReadTimeout",
    "ProxyError",
    "SSLError",
    "Network is unreachable",
    "Connection refused",
)


class OracleUnavailable(RuntimeError):
    """PyPI could not be reached: the caller skips, saying so."""


def cache_root() -> Path:
    """``PALIMPSEST_VOCAB_CACHE``, else ``~/.cache/palimpsest-vocab``: never inside the repository."""
    configured = os.environ.get("PALIMPSEST_VOCAB_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "palimpsest-vocab"


def vocab_dir(root: Path | None = None) -> Path:
    """The folder of llama.cpp's vocab files and vectors, downloaded on first use."""
    return _fetched(
        SDIST, root, lambda member: MODELS_IN_SDIST in member and member.rpartition("/")[2].startswith(VOCAB_PREFIX)
    )


def mistral_dir(root: Path | None = None) -> Path:
    """The folder of Mistral's SentencePiece models, from mistral-common's wheel."""
    return _fetched(MISTRAL_WHEEL, root, lambda member: member.rpartition("/")[2] in SPM_FILES.values())


def _fetched(requirement: str, root: Path | None, keep: Callable[[str], bool]) -> Path:
    """A package's files that ``keep`` names, flat in a folder of the cache.

    Parallel-safe: test workers take a file lock, the first downloads, the others find it done;
    the folder appears whole (renamed into place) or not at all."""
    root = root or cache_root()
    target = root / requirement.replace("==", "-")
    if (target / ".complete").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").is_file():
            _download(requirement, target, keep)
    return target


def _download(requirement: str, target: Path, keep: Callable[[str], bool]) -> None:
    sdist = requirement == SDIST
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--retries",
            "1",
            "--timeout",
            "30",
            "-d",
            scratch,
            requirement,
            *(["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise OracleUnavailable(f"pip download {requirement} timed out") from exc
        archives = list(Path(scratch).glob("*.tar.gz" if sdist else "*.whl"))
        if done.returncode != 0 or not archives:
            why = f"pip download {requirement} failed: {done.stderr.strip()[-400:]}"
            # Only an unreachable index is a reason to skip; any other failure is the test's.
            if any(sign in done.stderr for sign in _NETWORK_FAILURES):
                raise OracleUnavailable(why)
            raise RuntimeError(why)
        staged = Path(scratch) / "files"
        staged.mkdir()
        if sdist:
            with tarfile.open(archives[0]) as archive:
                for member in archive.getmembers():
                    source = archive.extractfile(member) if member.isfile() and keep(member.name) else None
                    if source is not None:
                        with source, open(staged / member.name.rpartition("/")[2], "wb") as out:
                            shutil.copyfileobj(source, out)
        else:
            with zipfile.ZipFile(archives[0]) as wheel:
                for name in wheel.namelist():
                    if keep(name):
                        (staged / name.rpartition("/")[2]).write_bytes(wheel.read(name))
        (staged / ".complete").write_text(requirement)
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
        # Bytes, not text mode: a "\r" in a vector must reach the tokenizer as written.
        raw = self.path.with_name(self.path.name + ".inp").read_bytes().decode("utf-8")
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
    return [
        OracleVocab(p.name[len(VOCAB_PREFIX) : -len(".gguf")], p) for p in sorted(folder.glob(VOCAB_PREFIX + "*.gguf"))
    ]


def model_info(path: Path) -> dict[str, Any]:
    """The GGUF file's tokenizer fields as Ollama's ``/api/show`` (verbose) gives them: the
    simulator's reader, so a vocabulary here is read as the simulator serves it."""
    return gguf.model_info(path)


def spm_model_info(path: Path) -> dict[str, Any]:
    """A SentencePiece model's fields as llama.cpp's converter writes them into a GGUF file."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    processor = spm.SentencePieceProcessor(model_file=str(path))
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    size = processor.get_piece_size()

    def kind(i: int) -> int:  # GGUF token types, in the converter's order of precedence
        checks = (
            (processor.is_unknown, 2),
            (processor.is_control, 3),
            (processor.is_byte, 6),
            (processor.is_unused, 5),
        )
        return next((value for check, value in checks if check(i)), 1)

    return {
        "general.name": path.name,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": [processor.id_to_piece(i) for i in range(size)],
        "tokenizer.ggml.scores": [processor.get_score(i) for i in range(size)],
        "tokenizer.ggml.token_type": [kind(i) for i in range(size)],
        "tokenizer.ggml.bos_token_id": processor.bos_id(),
        "tokenizer.ggml.eos_token_id": processor.eos_id(),
        "tokenizer.ggml.unknown_token_id": processor.unk_id(),
        "tokenizer.ggml.add_space_prefix": proto.normalizer_spec.add_dummy_prefix,
    }


def vocab_info(name: str, root: Path | None = None) -> dict[str, Any]:
    """A case's vocabulary by name: one of llama.cpp's files, or one of Mistral's models."""
    if name in SPM_FILES:
        return spm_model_info(mistral_dir(root) / SPM_FILES[name])
    return model_info(vocab_dir(root) / f"{VOCAB_PREFIX}{name}.gguf")


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
    "\n",
    " ",
    "  ",
    "\t",
    "\n\n\n\n\n\n\n\n",
    "a\n\n\n\n\nb",
    "x" + " " * 40 + "y",
    "\u00a0\u00a0nbsp\u3000ideographic\u2009thin",
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
    pool = [
        *map(chr, range(32, 127)),
        *"\n\n\n\t\r  ",
        *"éüßøÆœçñ",
        "e\u0301",
        *"中文日本語한국어",
        *"кириллицаΕλληνικά",
        *"١٢٣٣४५६",
        *"¹½Ⅻ",
        *"🎉👍🏽🦙",
        "\u200d",
        "\u00a0",
        "\u3000",
        "\u2009",
        "\u0085",
        *"，。！？「」",
        *"∑∞≠€©°",
        *"\u0915\u094d\u0937",
        *"ภาษา",
        *"ＡＢ１２",
    ]
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
    from palimpsest.compressor.special_tokens import matched_tokens

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
    "gpt-2": (
        "deepseek-v3",
        "gpt-4o",
        "llama4",
        "smollm",
        "chatglm-bpe",
        "stablelm2",
        "olmo",
        "exaone",
        "exaone4",
        "codeshell",
        "smaug-bpe",
        "dbrx",
        "deepseek-r1-qwen",
        "hunyuan",
        "megrez",
        "solar-open",
        "kormo",
        "f2llmv2",
        "minimax-m2",
        "kanana2",
        "talkie",
        "hunyuan-dense",
        "joyai-llm",
        "hy_v4",
        "phi-2",
        "jais",
        "trillion",
        "granite-docling",
        "gigachat",
        "a.x-4.0",
        "mellum",
        "minerva-7b",
        "mellum2",
        "grok-2",
        "ufakzeka",
        "seed-coder",
        "bailingmoe",
        "bailingmoe2",
        "llada-moe",
        "exaone-moe",
        "laguna",
        "poro-chat",
        "bloom",
        "gpt3-finnish",
        "viking",
        "jais-2",
        "spark2_5",
    ),
    "llama-bpe": (
        "tekken",
        "glm4",
        "llama3",
        "llama-v3",
        "falcon3",
        "pixtral",
        "lfm2",
        "gpt-4o",
        "deepseek-v3",
        "midm-2.0",
        "exaone-moe",
        "bailingmoe",
        "seed-coder",
        "minicpm5",
        "jais-2",
    ),
}
DATA = Path(__file__).parents[1] / "data" / "vocab_llamacpp_counts.json"


# Flags other models of a kind set: SentencePiece without the space prefix (Gemma 2/3, Mistral's
# later SentencePiece vocabularies), checked on llama-spm with the flag off.
FLAGGED = {"llama-spm~no-space-prefix": ("llama-spm", {"tokenizer.ggml.add_space_prefix": False})}


class Case(NamedTuple):
    vocab: str  # the vocab file's name
    pre: str | None  # a tokenizer.ggml.pre to load it with instead of its own
    flags: dict[str, bool]  # boolean tokenizer fields to load it with instead of its own


def cases(folder_names: list[str]) -> dict[str, Case]:
    found = {name: Case(name, None, {}) for name in [*folder_names, *SPM_FILES] if name not in EMBEDDING_ONLY}
    for proxy, names in RELABELLED.items():
        found.update({f"{pre}@{proxy}": Case(proxy, pre, {}) for pre in names})
    found.update({name: Case(vocab, None, flags) for name, (vocab, flags) in FLAGGED.items()})
    return found


def relabelled(info: dict[str, Any], case: Case) -> dict[str, Any]:
    pre = {} if case.pre is None else {"tokenizer.ggml.pre": case.pre}
    return {**info, **pre, **case.flags}


def llama_cpp_ids(driver: Path, gguf: Path, case: Case, texts: list[str]) -> list[list[int]]:
    """llama.cpp's ids for each text: llama_tokenize(add_special=false, parse_special=true), what
    llama-server does to a prompt less the BOS; ``driver`` is llamacpp_tokenize.cpp built."""
    payload = "\0".join(texts).encode("utf-8")
    flags = [f"{key}={int(value)}" for key, value in case.flags.items()]  # the driver takes one
    done = subprocess.run(
        [str(driver), str(gguf), case.pre or "", "1", *flags],
        input=payload,
        capture_output=True,
        check=True,
        timeout=600,
    )
    lines = done.stdout.decode().split("\n")[: len(texts)]
    return [[int(i) for i in line.split()] for line in lines]


def regenerate(driver: Path) -> None:
    """Counts every case's texts with llama.cpp and writes DATA (run by hand when cases change)."""
    folder = vocab_dir()
    names = [v.name for v in vocabularies(folder)]
    common = [*VARIED_TEXTS, *random_texts(25, 300)]
    data: dict[str, Any] = {"llama_cpp": SDIST, "cases": {}, "counts": {}, "common_texts": common, "special_texts": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for name, case in cases(names).items():
            data["cases"][name] = list(case)
            vocab = case.vocab
            gguf = folder / f"{VOCAB_PREFIX}{vocab}.gguf"
            if vocab in SPM_FILES:  # llama.cpp reads a GGUF file: the converter's, written here
                gguf = _write_spm_gguf(
                    vocab_info(vocab), folder / f"{VOCAB_PREFIX}llama-spm.gguf", Path(scratch) / f"{vocab}.gguf"
                )
            info = relabelled(vocab_info(vocab), case)
            special = data["special_texts"].setdefault(vocab, texts_for(info)[len(VARIED_TEXTS) + 300 :])
            ids = llama_cpp_ids(driver, gguf, case, [*common, *special])
            data["counts"][name] = [len(i) for i in ids]
            print(name, sum(data["counts"][name]), file=sys.stderr)
    DATA.write_text(_one_entry_a_line(data), encoding="utf-8")


def _write_spm_gguf(info: dict[str, Any], like: Path, path: Path) -> Path:
    """A vocab-only GGUF of a SentencePiece model, its model fields taken from ``like`` (needs the
    ``gguf`` package, only for regenerating)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    for key, field in GGUFReader(like).fields.items():
        if key.startswith(("GGUF.", "general.architecture", "tokenizer")):
            continue
        value = len(info["tokenizer.ggml.tokens"]) if key == "llama.vocab_size" else field.contents()
        adders = {
            GGUFValueType.STRING: writer.add_string,
            GGUFValueType.UINT32: writer.add_uint32,
            GGUFValueType.FLOAT32: writer.add_float32,
        }
        adders[field.types[0]](key, value)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(info["tokenizer.ggml.tokens"])
    writer.add_token_scores(info["tokenizer.ggml.scores"])
    writer.add_token_types(info["tokenizer.ggml.token_type"])
    writer.add_bos_token_id(info["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(info["tokenizer.ggml.eos_token_id"])
    writer.add_unk_token_id(info["tokenizer.ggml.unknown_token_id"])
    writer.add_add_space_prefix(info["tokenizer.ggml.add_space_prefix"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _one_entry_a_line(data: dict[str, Any]) -> str:
    """JSON a reviewer can diff: each case's counts, each text, on a line of its own."""

    def block(value: Any) -> str:
        if isinstance(value, dict):
            return (
                "{\n"
                + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in value.items())
                + "\n }"
            )
        if isinstance(value, list):
            return "[\n" + ",\n".join(f"  {json.dumps(v, ensure_ascii=False)}" for v in value) + "\n ]"
        return json.dumps(value)

    return "{\n" + ",\n".join(f" {json.dumps(k)}: {block(v)}" for k, v in data.items()) + "\n}\n"


def table() -> str:
    """The README's table: per case, the cases checked and how many counts equal llama.cpp's."""
    from palimpsest.compressor.vocabulary import UnsupportedVocabulary, build_tokenizer

    folder = vocab_dir()
    data = json.loads(DATA.read_text(encoding="utf-8"))
    rows = [
        "| vocabulary (`tokenizer.ggml.pre`) | llama.cpp's vectors: counts equal | our texts: counts equal | counted |",
        "|---|---|---|---|",
    ]
    for vocab in EMBEDDING_ONLY:
        kind = model_info(folder / f"{VOCAB_PREFIX}{vocab}.gguf")["tokenizer.ggml.model"]
        rows.append(f"| {vocab} (`{kind}`) | – | – | refused: embedding-only model kind |")
    for name, fields in data["cases"].items():
        case = Case(*fields)
        vocab, pre = case.vocab, case.pre
        info = relabelled(vocab_info(vocab), case)
        label = f"{name} (`{info.get('tokenizer.ggml.pre') or info['tokenizer.ggml.model']}`)"
        try:
            tokenizer = build_tokenizer(info)
        except UnsupportedVocabulary as exc:
            rows.append(f"| {label} | – | – | refused: {exc} |")
            continue
        oracle = OracleVocab(vocab, folder / f"{VOCAB_PREFIX}{vocab}.gguf")
        vectors, vectors_equal = "–", True
        if pre is None and not case.flags and oracle.has_vectors:
            pairs = oracle.vectors()
            got = tokenizer.encode_batch([t for t, _ in pairs], add_special_tokens=False)
            equal = sum(len(mine.ids) == len(ids) for mine, (_, ids) in zip(got, pairs))
            vectors, vectors_equal = f"{equal} of {len(pairs)}", equal == len(pairs)
        texts = [*data["common_texts"], *data["special_texts"][vocab]]
        counts = [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
        equal = sum(a == b for a, b in zip(counts, data["counts"][name]))
        verdict = "exact" if equal == len(texts) and vectors_equal else "wrong"
        rows.append(f"| {label} | {vectors} | {equal} of {len(texts)} | {verdict} |")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        print(table())
    else:
        regenerate(Path(sys.argv[1]))
