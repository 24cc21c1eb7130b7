"""Secret redaction applied at the SessionStore's save boundary.

What is redacted, and only that: the arguments of the tool calls in a saved message
(``redact_arguments``, from ``convert.tool_calls_json``), the arguments and error text of the audit
log's tool runs (``convert.tool_run_row``: the same rules, so a run's arguments read as its stored
call's) and the URIs of external refs (``redact_uri``). Message content, thinking and tool results
are stored as sent.

* ``redact_arguments`` tool-call arguments, kept valid JSON when they were JSON
* ``redact_uri``       external-ref URIs (userinfo password, secret query params)
* ``redact_text``      the free-text rules both apply (to non-JSON arguments, string values, URIs)

Every function is pure and idempotent: redacting an already-redacted value
returns it unchanged, so a session can be saved any number of times without
the stored text drifting.

The rules are deliberately conservative.  A false negative leaks a secret that
was already in the conversation; a false positive silently corrupts code or
prose the agent later reads back and acts on.  So each pattern requires a
shape that ordinary text does not have (a known key prefix, a ``key=value``
with a literal value, a ``user:pass@`` in a URL) rather than guessing from
entropy alone.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

MASK = "[REDACTED]"

# Returned when structural redaction blows up: losing the arguments is
# better than storing them unredacted.
REDACTION_FAILED = '{"redacted":true}'

# --- whole-token patterns ------------------------------------------------------
# Everything matched here is replaced by MASK entirely: the prefix is part of the
# credential format, not a separate key worth keeping.

_PEM_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
    # A terminated block, or (when the text was truncated mid-key) the base64
    # body that follows, so half a key is not stored either.
    # The body runs up to the next "-----" and no further, so text full of
    # unterminated BEGIN lines stays linear instead of each BEGIN scanning
    # to the end of the text for an END.
    r"(?:(?:[^-]|-(?!----))*+-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|[A-Za-z0-9+/=\\\s]*+)",
    re.DOTALL,
)

# Not preceded by a character that could continue an identifier, so "task-..."
# or "mask-..." never look like an OpenAI "sk-" key.
_NOT_AFTER_WORD = r"(?<![A-Za-z0-9_\-])"
_NOT_BEFORE_WORD = r"(?![A-Za-z0-9_\-])"

_API_KEYS = re.compile(
    "|".join(
        f"{_NOT_AFTER_WORD}(?:{body}){_NOT_BEFORE_WORD}"
        for body in (
            r"sk-[A-Za-z0-9_\-]{20,}",  # OpenAI / Anthropic style (sk-proj-, sk-ant-)
            r"gh[pousr]_[A-Za-z0-9]{20,}",  # GitHub classic tokens
            r"github_pat_[A-Za-z0-9_]{20,}",  # GitHub fine-grained tokens
            r"xox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack
            r"(?:AKIA|ASIA)[A-Z0-9]{16}",  # AWS access key ids
            r"AIza[0-9A-Za-z_\-]{35}",  # Google API keys
        )
    )
)

# JWT: base64url(JSON header).base64url(payload).signature.  The header of every
# JWT starts with '{"', which base64-encodes to "eyJ" -- requiring it keeps
# dotted identifiers like "a.b.c" out.  The signature may be empty (alg=none).
_JWT = re.compile(
    rf"{_NOT_AFTER_WORD}eyJ[A-Za-z0-9_\-]{{5,}}\.[A-Za-z0-9_\-]{{5,}}\.[A-Za-z0-9_\-]*"
    rf"{_NOT_BEFORE_WORD}"
)

# --- patterns that keep a label and mask only the credential -------------------

_CREDENTIAL = r"[A-Za-z0-9._~+/=\-]+"

# "Authorization: <scheme> <credential>" in headers, curl commands, logs.
_AUTH_HEADER = re.compile(
    rf"\b(?P<label>(?:Proxy-)?Authorization\s*:\s*)"
    rf"(?:(?P<scheme>Bearer|Basic|Token|Digest|Bot|ApiKey|Negotiate)\s+)?"
    rf"(?P<cred>{_CREDENTIAL})",
    re.IGNORECASE,
)

# "Bearer <token>" anywhere else.
_BEARER = re.compile(rf"\b(?P<label>Bearer\s+)(?P<cred>{_CREDENTIAL})", re.IGNORECASE)

# "scheme://user:password@host": keep the user, mask the password.
_URL_PASSWORD = re.compile(
    # The lookbehind plus possessive quantifiers make each scheme start one
    # linear scan; a plain \b start is quadratic on text like "a-a-a-a-...".
    r"(?P<prefix>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*+://[^\s/:@\"'<>]*+:)"
    r"(?P<password>[^\s/@\"'<>]++)(?=@)"
)

# "password=...", "secret: ...", "api-key = '...'", "--token=...", '"token": "..."'.
# The key must END with a secret word: "token_count",
# "max_tokens" and "secret_name" are ordinary identifiers and never match.
_SECRET_WORDS = (
    r"password|passwd|passphrase|secret|token|api[_\-]?key|access[_\-]?key"
    r"|secret[_\-]?key|private[_\-]?key|client[_\-]?secret|credentials?"
)
# Spelled out for the lookbehind below, which needs fixed-width alternatives.
_SECRET_WORD_SPELLINGS = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "credential",
    "credentials",
    *(
        f"{a}{sep}{b}"
        for a, b in (("api", "key"), ("access", "key"), ("secret", "key"), ("private", "key"), ("client", "secret"))
        for sep in ("", "_", "-")
    ),
)
_ENDS_WITH_SECRET_WORD = "(?:%s)" % "|".join(f"(?<={word})" for word in _SECRET_WORD_SPELLINGS)
_ASSIGNMENT = re.compile(
    # The key is a whole identifier-like run, taken possessively and then
    # checked to END with a secret word.  (A lazy prefix before the word
    # alternation is quadratic on long runs such as "a.a.a.a...".)
    rf"(?P<key>(?<![A-Za-z0-9_.\-])[A-Za-z0-9_.\-]*+{_ENDS_WITH_SECRET_WORD})"
    r"(?P<keyquote>[\"']?)"
    # "==" / "!=" are comparisons, not assignments.
    r"(?P<sep>\s*(?P<op>[:=])(?!=)[ \t]*)"
    r"(?P<value>\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|[^\s\"'`,;&<>)}\]]+)",
    re.IGNORECASE,
)
# A variable named for a secret ("password", "access_token", "client_secret"):
# forwarding it ("token=access_token") passes a reference, not the secret.
_SECRET_VARIABLE = re.compile(rf"(?:[A-Za-z_][A-Za-z0-9_]*?)?(?:{_SECRET_WORDS})", re.IGNORECASE)

# Unquoted right-hand sides that are code, not a literal secret: type
# annotations ("password: str"), constants, keywords that start expressions.
_CODE_WORDS = frozenset(
    {
        "none",
        "null",
        "nil",
        "true",
        "false",
        "undefined",
        "str",
        "string",
        "bytes",
        "int",
        "bool",
        "dict",
        "list",
        "any",
        "optional",
        "await",
        "new",
        "this",
        "self",
        "lambda",
        "yield",
        "not",
        "function",
        "async",
        "secretstr",
        "required",
        "object",
        "number",
        "char",
        "void",
        "const",
        "let",
        "var",
        "is",
        "in",
        "if",
    }
)
_DOTTED_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_END_OF_STATEMENT = re.compile(r"[ \t]*(?:[,;}\])]|\r?\n|$)")


# An AWS secret access key: 40 base64 characters standing alone. Git hashes (lowercase hex), paths
# and identifiers share the length but not the look: a secret mixes cases with digits and, being
# random, uses many different characters (40 draws from 64 give ~30 distinct; a path of words ~23).
_BARE_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_RANDOM_DISTINCT_CHARS = 26


def _random_looking(candidate: str) -> bool:
    return (
        any(c.isdigit() for c in candidate)
        and any(c.isupper() for c in candidate)
        and any(c.islower() for c in candidate)
        and len(set(candidate)) >= _RANDOM_DISTINCT_CHARS
    )


def redact_text(text: str) -> str:
    """Return ``text`` with every recognised secret replaced by ``[REDACTED]``."""
    # Order matters: whole-token formats go first so that e.g. "api_key=sk-..."
    # becomes "api_key=[REDACTED]" via the key pattern, and the assignment
    # rule then sees an already-masked value and leaves it alone.
    text = _PEM_PRIVATE_KEY.sub(_masked_keeping_trailing_space, text)
    text = _URL_PASSWORD.sub(lambda m: m["prefix"] + MASK, text)
    text = _API_KEYS.sub(MASK, text)
    text = _JWT.sub(MASK, text)
    text = _BARE_SECRET.sub(lambda m: MASK if _random_looking(m[0]) else m[0], text)
    text = _AUTH_HEADER.sub(_masked_auth_header, text)
    text = _BEARER.sub(_masked_bearer, text)
    text = _ASSIGNMENT.sub(_masked_assignment, text)
    return text


def _masked_keeping_trailing_space(match: re.Match[str]) -> str:
    # The truncated-key branch swallows trailing whitespace; give it back so the
    # following line does not get glued onto the mask.
    block = match[0]
    return MASK + block[len(block.rstrip()) :]


def _looks_like_credential(value: str) -> bool:
    # After "Bearer"/"Authorization:" prose continues with ordinary words
    # ("bearer authentication"); real credentials carry a digit or are long.
    return value != MASK and (any(c.isdigit() for c in value) or len(value) >= 24)


def _masked_auth_header(match: re.Match[str]) -> str:
    if match["scheme"] is None and not _looks_like_credential(match["cred"]):
        return match[0]
    scheme = f"{match['scheme']} " if match["scheme"] else ""
    return f"{match['label']}{scheme}{MASK}"


def _masked_bearer(match: re.Match[str]) -> str:
    if not _looks_like_credential(match["cred"]):
        return match[0]
    return match["label"] + MASK


def _masked_assignment(match: re.Match[str]) -> str:
    value = match["value"]
    quoted = value[:1] in {'"', "'"}
    inner = value[1:-1] if quoted else value
    if not _is_literal_secret(inner, quoted):
        return match[0]
    if match["op"] == ":" and not quoted and not _value_ends_statement(match):
        # "Enter a password: it must be long" -- a colon followed by more
        # words is prose; "password: hunter2" at the end of a line is YAML.
        return match[0]
    masked = f"{value[0]}{MASK}{value[0]}" if quoted else MASK
    return f"{match['key']}{match['keyquote']}{match['sep']}{masked}"


def _is_literal_secret(value: str, quoted: bool) -> bool:
    """Whether an assignment's right-hand side is a secret literal, not code."""
    if not value or value == MASK:
        return False
    if value.startswith(("$", "%(", "{{", "${", "<")):
        # Placeholders and variable references ("$DB_PASSWORD", "{{ secret }}")
        # name a secret without containing it.
        return False
    if quoted:
        return True
    if "(" in value or "[" in value:
        return False  # call or subscript: password = getpass(), os.environ["X"]
    if value.lower() in _CODE_WORDS:
        return False
    if _DOTTED_IDENTIFIER.fullmatch(value):
        return False  # attribute access: token = settings.token
    if _SECRET_VARIABLE.fullmatch(value):
        return False  # variable forwarding: password=password, token=access_token
    return True


def _value_ends_statement(match: re.Match[str]) -> bool:
    return _END_OF_STATEMENT.match(match.string, match.end()) is not None


# --- structured tool-call arguments ---------------------------------------------

# Normalised (lower-case, no "-", "_", spaces) key names whose value is a secret
# no matter what it looks like.  A key matches when it ends with one of these,
# so "db_password" and "githubToken" match while "max_tokens" and
# "token_count" do not.  "pwd" is left out on purpose: shell tools use it for
# the working directory.
_SECRET_KEY_SUFFIXES = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "accesskey",
    "privatekey",
    "authorization",
    "credential",
    "credentials",
    "cookie",
)
_SECRET_KEY_EXACT = frozenset({"auth", "pass", "xapikey", "sessionid"})


def is_secret_key(key: str) -> bool:
    """Whether a JSON/header key names a secret (case-insensitive, ``-``/``_`` tolerant)."""
    normalised = re.sub(r"[\s_\-.]", "", key).lower()
    return normalised in _SECRET_KEY_EXACT or normalised.endswith(_SECRET_KEY_SUFFIXES)


def redact_arguments(arguments: str) -> str:
    """Return tool-call ``arguments`` with secrets masked, still valid JSON if it was JSON."""
    try:
        parsed = _parsed_json(arguments)
        if parsed is _NOT_JSON:
            return redact_text(arguments)
        return json.dumps(redact_json(parsed), separators=(",", ":"), ensure_ascii=False)
    except Exception:  # noqa: BLE001 -- never store what we failed to redact
        return REDACTION_FAILED


_NOT_JSON = object()


def _parsed_json(text: str) -> Any:
    def reject_constant(name: str) -> Any:
        # NaN/Infinity are not JSON; treat such arguments as text rather than
        # re-emitting a non-standard document.
        raise ValueError(name)

    try:
        return json.loads(text, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        return _NOT_JSON


def redact_json(value: Any) -> Any:
    """Return a redacted copy of a parsed JSON value (keys and string values)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        return [redact_json(item) for item in value]
    if isinstance(value, dict):
        return _redacted_object(value)
    return value


def _redacted_object(obj: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, item in obj.items():
        new_key = _unique_key(redact_text(key), result)
        secret = is_secret_key(key) and not _is_session_reference(key, item)
        result[new_key] = _masked_secret_value(item) if secret else redact_json(item)
    return result


def _is_session_reference(key: str, value: Any) -> bool:
    """A `session_id` holding a UUID names a Palimpsest session (a tool's own argument), not a web
    session cookie: masking it would destroy the reference."""
    if re.sub(r"[\s_\-.]", "", key).lower() != "sessionid" or not isinstance(value, str):
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _masked_secret_value(value: Any) -> Any:
    # Booleans and null carry no secret ("password": null means "none set") and
    # keeping them keeps the arguments' meaning; anything else goes wholesale.
    if value is None or isinstance(value, bool):
        return value
    return MASK


def _unique_key(key: str, taken: dict[str, Any]) -> str:
    # Two secrets used as keys can redact to the same string; suffix the later
    # one instead of letting it overwrite the earlier entry.
    if key not in taken:
        return key
    n = 2
    while f"{key} ({n})" in taken:
        n += 1
    return f"{key} ({n})"


# --- external-ref URIs -----------------------------------------------------------

# Query/fragment parameter names (normalised like is_secret_key) whose value is a
# credential: OAuth tokens, presigned-URL signatures, plain keys, session ids.
_SECRET_URI_PARAMS = frozenset(
    {
        "token",
        "accesstoken",
        "idtoken",
        "refreshtoken",
        "authtoken",
        "key",
        "apikey",
        "signature",
        "sig",
        "password",
        "pass",
        "passwd",
        "pwd",
        "secret",
        "clientsecret",
        "code",
        "auth",
        "xamzsignature",
        "xamzcredential",
        "xamzsecuritytoken",
        "xgoogsignature",
        "xgoogcredential",
        "sessiontoken",
        "jwt",
        "jsessionid",
        "phpsessid",
        "aspnetsessionid",  # (sessionid: is_secret_key)
    }
)
_PARAM = re.compile(r"(?P<key>[^&;=#]+)=(?P<value>[^&;#]*)")
# A path segment's own parameters, as servlet containers put the session there: /cart;jsessionid=…
_PATH_PARAM = re.compile(r";(?P<key>[^/;=]+)=(?P<value>[^/;]*)")

# Webhook URLs whose path is the credential: whoever has the URL can post. The ids before the
# secret stay, so a reader still tells one hook from another.
_PATH_SECRETS = re.compile(
    # Slack: /services/T…/B…/<secret> (and the /workflows/ and /triggers/ forms)
    r"(?P<slack>//hooks\.slack\.com/(?:services|workflows|triggers)/(?:[^/?#]+/)+)[^/?#]+"
    # Discord: /api/webhooks/<id>/<token>
    r"|(?P<discord>//(?:(?:ptb|canary)\.)?discord(?:app)?\.com/api(?:/v\d+)?/webhooks/\d+/)[^/?#]+"
    # Telegram bots: /bot<id>:<token>/<method>
    r"|(?P<telegram>//api\.telegram\.org/(?:file/)?bot\d+:)[^/?#]+",
    re.IGNORECASE,
)


def redact_uri(uri: str) -> str:
    """Return ``uri`` with its userinfo password, secret parameters and path-borne secrets masked.

    The URI is never parsed for resolution -- only split textually -- so the
    stored value keeps the caller's exact spelling everywhere else.
    """
    uri = _URL_PASSWORD.sub(lambda m: m["prefix"] + MASK, uri)
    base, hash_sign, fragment = uri.partition("#")
    path, question, query = base.partition("?")
    path = _PATH_SECRETS.sub(lambda m: next(kept for kept in m.groups() if kept) + MASK, path)
    redacted = _PATH_PARAM.sub(_masked_param, path) + question + _PARAM.sub(_masked_param, query)
    if hash_sign:
        # OAuth implicit flow puts access_token in the fragment.
        redacted += hash_sign + _PARAM.sub(_masked_param, fragment)
    # Known token formats can also sit in a path segment (GitHub and Slack tokens).
    return redact_text(redacted)


def _masked_param(match: re.Match[str]) -> str:
    name = re.sub(r"[\s_\-.]|%2[dD]|%5[fF]", "", match["key"]).lower()
    if match["value"] and (name in _SECRET_URI_PARAMS or is_secret_key(name)):
        return match[0][: match.start("value") - match.start()] + MASK
    return match[0]
