"""What a session keeps as a file, and how its files are named and linked.

The SessionStore enforces these rules on every upload; the Agent checks a turn's inline
attachments against the same rules before it creates or writes anything, so a refused file
costs nothing. Pure functions.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import quote, unquote

from palimpsest.shared.errors import InvalidArgument

MAX_NAME_BYTES = 255
LINK_PREFIX = "palimpsest://sessions/"

# Extensions of programs and scripts: what an OS, a shell, a desktop or a common viewer runs when
# the file is opened (Windows' blocked-attachment list, Unix launchers, interpreters, packages).
# Rejected case-insensitively on the last suffix only: "notes.sh.txt" is a text file by name, and
# the content check still catches it if it starts with a shebang.
EXECUTABLE_EXTENSIONS = frozenset(
    {
        ".sh",
        ".bash",
        ".zsh",
        ".ksh",
        ".csh",
        ".fish",
        ".command",
        ".desktop",
        ".cgi",
        ".py",
        ".pyc",
        ".pyo",
        ".pyw",
        ".pyz",
        ".pl",
        ".rb",
        ".php",
        ".lua",
        ".tcl",
        ".js",
        ".mjs",
        ".cjs",
        ".jse",
        ".vbs",
        ".vbe",
        ".vb",
        ".wsf",
        ".wsh",
        ".ws",
        ".wsc",
        ".sct",
        ".ps1",
        ".psm1",
        ".psd1",
        ".ps1xml",
        ".psc1",
        ".msh",
        ".ps",
        ".eps",  # PowerShell; PostScript
        ".exe",
        ".bat",
        ".cmd",
        ".com",
        ".pif",
        ".scr",
        ".cpl",
        ".msc",
        ".hta",
        ".chm",
        ".inf",
        ".reg",
        ".lnk",
        ".url",
        ".scf",
        ".msi",
        ".msp",
        ".mst",
        ".msix",
        ".appx",
        ".application",
        ".gadget",
        ".dll",
        ".so",
        ".dylib",
        ".bin",
        ".app",
        ".jar",
        ".class",
        ".jnlp",
        ".wasm",
        ".dex",
        ".apk",
        ".elf",
        ".run",
        ".out",
        ".appimage",
        ".deb",
        ".rpm",
        ".pkg",
        ".dmg",
        ".xll",
    }
)

# Magic numbers of programs.  Mach-O is listed in both byte orders;
# 0xCAFEBABE is the fat (universal) binary header and also a Java class file,
# which is just as unwelcome.
_EXECUTABLE_MAGICS = (
    b"\x7fELF",
    b"MZ",  # DOS/PE
    b"\xfe\xed\xfa\xce",
    b"\xce\xfa\xed\xfe",  # Mach-O 32-bit
    b"\xfe\xed\xfa\xcf",
    b"\xcf\xfa\xed\xfe",  # Mach-O 64-bit
    b"\xca\xfe\xba\xbe",
    b"\xbe\xba\xfe\xca",  # fat binary / Java class
    b"#!",  # interpreter script
    b"\x00asm",  # WebAssembly
    b"dex\n0",  # Android (Dalvik) bytecode, "dex\n035\0" and later
    b"L\x00\x00\x00\x01\x14\x02\x00",  # Windows shortcut (.lnk)
    b"%!PS",  # PostScript: a program its viewers run
)
PROGRAM_CONTENT = (
    "its content starts like one (#!, or the header of an executable, WebAssembly, PostScript or a shortcut)"
)

_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9._ -]")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def refused_as_program(name: str, why: str, *, by_name: bool = True) -> str:
    """Why a file was refused, and what a session does take."""
    other_name = f"attach it under a text name such as {name + '.txt'!r}, or " if by_name else ""
    return (
        f"{name!r} is refused: a session keeps no programs or scripts, and {why}. Text, data, documents "
        f"and images are accepted; to show the model code, {other_name}paste it into your message"
    )


def split_extension(name: str) -> tuple[str, str]:
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        return name, ""
    return stem, "." + ext


def has_executable_extension(name: str) -> bool:
    return split_extension(name.lower())[1] in EXECUTABLE_EXTENSIONS


def has_executable_magic(head: bytes) -> bool:
    return head.startswith(_EXECUTABLE_MAGICS)


def safe_name(name: str) -> str:
    """Return ``name`` reduced to a plain file name that stays inside a folder."""
    # Clients send Windows paths too, so both separators strip directories.
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    # NFKC folds look-alikes (full-width letters) to ASCII before the
    # allowlist turns everything else into "_".
    base = unicodedata.normalize("NFKC", base)
    base = _CONTROL_CHARS.sub("", base)
    base = _UNSAFE_CHARS.sub("_", base)
    base = re.sub(r"_{2,}", "_", base)
    base = re.sub(r" {2,}", " ", base)
    # Leading dots would make hidden files (and collide with upload temp
    # files); trailing dots/spaces are stripped by some filesystems.
    base = base.lstrip(". ").rstrip(". ")
    if not base:
        raise InvalidArgument("filename", f"{name!r} does not contain a usable file name")
    return _capped(base, MAX_NAME_BYTES)


def _capped(name: str, limit: int) -> str:
    """Return ``name`` cut to ``limit`` bytes, keeping its extension when it has one."""
    if len(name.encode()) <= limit:
        return name
    stem, ext = split_extension(name)
    if len(ext) >= limit // 2:
        # An "extension" this long is not one worth keeping.
        stem, ext = name, ""
    return stem[: limit - len(ext)].rstrip(". ") + ext


def upload_name_problem(name: str) -> str:
    """Why ``name`` cannot name a file sent with a turn ("" when it can). A turn's file names are
    plain names: a folder part, a hidden name or a control character is refused, not quietly
    dropped, so what the model is told is what the client sent."""
    if not name.strip():
        return "is required"
    if len(name.encode()) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    if "/" in name or "\\" in name:
        return f"{name!r} has a folder part; send the file's own name, without folders"
    if name.startswith(".") or name in ("..", "."):
        return f"{name!r} is hidden or not a file name; session files have visible names"
    if _CONTROL_CHARS.search(name):
        return f"{name!r} holds control characters"
    if problem := unseen_character_problem(name):
        return problem
    if has_executable_extension(name):
        return refused_as_program(name, f"{split_extension(name.lower())[1]} is the extension of one")
    return ""


def unseen_character_problem(name: str) -> str:
    """Why ``name`` would not show what it is ("" when it would): a character that shows as nothing
    or as a space it is not (zero-width spaces and joiners, bidi controls, the BOM, line separators,
    no-break spaces), or a space at either end or a dot at its end, which file systems drop.
    Refused, never replaced: "x.py" and a zero-width space looks like x.py, and was stored as x.py_."""
    for char in name:
        category = unicodedata.category(char)
        if category in ("Cc", "Cf", "Zl", "Zp") or (category == "Zs" and char != " "):
            return (
                f"{name!r} holds U+{ord(char):04X} ({unicodedata.name(char, 'a control character')}), "
                "which does not show as what it is: name the file without it"
            )
    if name != name.strip(" ") or name.endswith("."):
        return f"{name!r} begins or ends with a space, or ends with a dot, which file systems drop"
    return ""


def session_path(session_id: str, name: str) -> str:
    """Where a session file is, as the model is told: the folder layout the file tools know."""
    return f"session_files/{session_id}/{name}"


def file_link(session_id: str, name: str) -> str:
    """A session file's link: palimpsest://sessions/<id>/files/<name>; a client fetches it with
    SessionStore.GetFile (`pal files get LINK`)."""
    return f"{LINK_PREFIX}{session_id}/files/{quote(name)}"


def parse_file_link(link: str) -> tuple[str, str] | None:
    """(session id, file name) of a link made by :func:`file_link`; None for anything else."""
    if not link.startswith(LINK_PREFIX):
        return None
    session_id, sep, name = link[len(LINK_PREFIX) :].partition("/files/")
    if not sep or not session_id or not name or "/" in session_id:
        return None
    return session_id, unquote(name)
