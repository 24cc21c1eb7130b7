"""`pal chat`: an interactive conversation with slash commands, attachments and pasted images."""

from __future__ import annotations

import argparse
import queue
import re
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import grpc
from rich.text import Text

from palimpsest.cli.app import App
from palimpsest.cli.chat_input import image_paths_in, parse_command, read_message
from palimpsest.cli.client_tools import LocalTool, add_client_tools_flag, declare, runner_for
from palimpsest.cli.commands import Subparsers
from palimpsest.cli.commands.turns import add_ref_flag
from palimpsest.cli.errors import CliError, ServiceError
from palimpsest.cli.render import ContextMeter, compressed_tokens, renderer_for
from palimpsest.cli.streaming import StreamResult, stream_turn
from palimpsest.cli.uploads import local_file, new_session, upload
from palimpsest.cli.views import message_view
from palimpsest.v1 import agent_pb2, common_pb2, compressor_pb2
from palimpsest.v1 import session_store_pb2 as pb

# On resuming a session, this many of its newest messages are shown as a reminder.
RESUME_MESSAGES = 6
HELP = """\
/new            start a new session with your next message
/compact        compress this session's context now
/profile [ID]   use another agent profile (no ID: list them)
/attach FILE    upload a file to the session; it goes with your next message, which tells the model where it is
/image PATH     send an image with your next message (image paths typed in a message are sent too)
/id             show the session id
/exit           leave (also Ctrl-D; Ctrl-C stops a running turn, a second Ctrl-C leaves)
A line ending with \\ continues on the next line; \"\"\" opens and closes a multi-line block."""


def nothing_to_compact(details: str) -> str:
    """The Agent's refusal of a compaction, said for someone who typed /compact."""
    short = re.search(r"nothing to compress in session \S+: the context cannot shrink \(([^)]*)\)", details)
    if short:
        return (
            f"nothing to compact yet: the context is only {short.group(1)}, and the newest turns are always "
            "kept as they are; /compact frees room once the conversation is longer"
        )
    return details.removeprefix("nothing to compact: ")  # the Agent's own words for any other reason


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("chat", help="an interactive conversation", parents=[common])
    p.add_argument("--id", dest="session_id", default="", help="resume this session")
    p.add_argument("--profile", default="", help="agent profile (default: the session's, else the Agent's default)")
    add_ref_flag(p, "add to the session (with your first message)")
    add_client_tools_flag(p)
    p.set_defaults(handler=chat)


class PipedLines:
    """Lines of a piped stdin, read by one thread of their own. A SIGINT the kernel hands to one of
    grpc's threads does not interrupt a blocking read in the main thread, so Ctrl-C would wait for
    the next line; waiting on a queue in short slices lets Python run the handler at once."""

    POLL_SECONDS = 0.2

    def __init__(self) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, name="pal-stdin", daemon=True).start()

    def _read(self) -> None:
        while True:
            line = sys.stdin.readline()
            self._lines.put(line)
            if not line:
                return

    def next(self) -> str:
        """The next line with its newline; "" at the end of input."""
        while True:
            try:
                return self._lines.get(timeout=self.POLL_SECONDS)
            except queue.Empty:
                continue


class SessionWatch:
    """A background WatchSession of the chat's session: a compression after a turn's stream_end
    (the post-turn pass) reaches no turn's stream, so without it the meter stayed wrong until the
    next answer. It only updates the meter and remembers what happened; the loop says it before
    the next prompt (printing while `input()` waits would tear the line being typed)."""

    # How long the prompt waits for the watch to be in place: an Agent slower than this to answer
    # is slow for the turn too, and the prompt should not hang on it.
    READY_S = 10.0

    def __init__(self, app: App, session_id: str, meter: ContextMeter) -> None:
        self.meter = meter
        self.compressed: compressor_pb2.ContextCompressed | None = None
        self._ready = threading.Event()
        self._call = app.conn.agent().WatchSession(agent_pb2.WatchSessionRequest(session_id=session_id))
        threading.Thread(target=self._follow, name="pal-watch", daemon=True).start()

    def wait_until_in_place(self) -> None:
        """The Agent subscribes a watch only after checking the caller's access: a compression before
        that was missed (under load, the one right after the first answer). It says when the watch is
        in place by sending its initial metadata; the next message goes only after that."""
        self._ready.wait(self.READY_S)

    def _follow(self) -> None:
        try:
            self._call.initial_metadata()
            self._ready.set()
            for event in self._call:
                if event.HasField("context_compressed") and event.seq == 0:  # after a stream_end
                    done = event.context_compressed
                    self.meter.update(compressed_tokens(done), done.max_context_tokens)
                    self.compressed = done
        except (ServiceError, grpc.RpcError):
            return  # cancelled, or the Agent went away: the meter goes back to turn events only
        finally:
            self._ready.set()  # nothing to wait for any more

    def take(self) -> compressor_pb2.ContextCompressed | None:
        done, self.compressed = self.compressed, None
        return done

    def close(self) -> None:
        self._call.cancel()


@dataclass
class Chat:
    app: App
    session_id: str = ""
    profile_id: str = ""
    # The profile is sent with the next message only: the session records it (and its model), and
    # resumes there, so a switch_profile the model made later is not undone by the message after.
    profile_pending: bool = True
    # Sent with the next message (--ref: the first), then part of the session.
    refs: list[common_pb2.ExternalRef] = field(default_factory=list)
    meter: ContextMeter = field(default_factory=ContextMeter)
    images: list[bytes] = field(default_factory=list)
    # Files uploaded with /attach, by stored name: they go with the next message.
    attachments: list[str] = field(default_factory=list)
    # Offered to the model with every message (--client-tools).
    tools: list[LocalTool] = field(default_factory=list)
    interactive: bool = field(default_factory=lambda: sys.stdin.isatty())
    _piped: PipedLines | None = None
    _watch: SessionWatch | None = None
    _watch_id: str = ""
    _reading: bool = False  # waiting for the user's input: where a Ctrl-C may interrupt
    _leave: bool = False  # a Ctrl-C came between turns, outside that wait

    # -- input -----------------------------------------------------------------------------------
    def read_line(self, prompt: str) -> str:
        if self.interactive and self.app.out.json:
            # stdout carries only JSON: the prompt goes where people look and scripts do not.
            sys.stderr.write(prompt)
            sys.stderr.flush()
            return input()
        if self.interactive:
            return input(prompt)
        # Piped input: no prompts, so the transcript stays what the model said.
        if self._piped is None:
            self._piped = PipedLines()
        line = self._piped.next()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    def say(self, text: str, style: str = "dim") -> None:
        (self.app.out.errors if self.app.out.json else self.app.out.console).print(
            Text(text, style=style), soft_wrap=True
        )

    # -- the loop --------------------------------------------------------------------------------
    def loop(self) -> int:
        try:
            return self._loop()
        finally:
            if self._watch is not None:
                self._watch.close()  # its stream would otherwise hold the channel open at exit

    def _loop(self) -> int:
        if self.interactive:
            import readline  # noqa: F401 — line editing and history for input()
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            return self._converse()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        """Ctrl-C between turns means "leave". It interrupts the wait for input only: raised anywhere
        else (a turn's stream just ended, a WatchSession being opened), it could land inside a gRPC
        call, whose channel then never closed (pal hung at exit). There it is noted, and taken before
        the next read."""
        if self._reading:
            raise KeyboardInterrupt
        self._leave = True

    def _converse(self) -> int:
        self.greet()
        while True:
            self.watch()
            self.after_turn_news()
            self._reading = True  # before the check: a Ctrl-C from here on interrupts the read
            try:
                if self._leave:
                    raise KeyboardInterrupt
                text = read_message(self.read_line, "you› ", "  … ")
            except KeyboardInterrupt:
                self.say("")
                self.farewell()
                return 0
            finally:
                self._reading = False
            if text is None:
                if self.interactive:
                    self.say("")  # Ctrl-D left the cursor after the prompt
                self.farewell()
                return 0
            if not text.strip():
                continue
            try:
                command = parse_command(text)
                if command is not None:
                    if not self.command(*command):
                        self.farewell()
                        return 0
                    continue
                result = self.send(text)
            except ServiceError as err:
                # One failed call should not end the conversation: say why and keep the prompt.
                self.say(f"error: {err}", "bold red")
                continue
            if result.leave or self._leave:
                self.farewell()
                return 0

    def farewell(self) -> None:
        """On leaving: the command that comes back to this conversation."""
        if self.session_id:
            self.say(f"session {self.session_id} · resume with: pal chat --id {self.session_id}")

    def watch(self) -> None:
        """Follow the current session's events between turns (see SessionWatch)."""
        if self._watch is not None and self._watch_id == self.session_id:
            return
        if self._watch is not None:
            self._watch.close()
        self._watch, self._watch_id = None, self.session_id
        if self.session_id and not self.app.out.json:
            try:
                self._watch = SessionWatch(self.app, self.session_id, self.meter)
                self._watch.wait_until_in_place()
            except (ServiceError, grpc.RpcError):
                pass  # an Agent without WatchSession: the meter follows the turns only

    def after_turn_news(self) -> None:
        """What happened to the session since the last answer: a compression after it."""
        done = self._watch.take() if self._watch is not None else None
        if done is not None:
            self.say(
                f"context compressed after the last answer: {done.messages_before} → {done.messages_after} "
                f"messages, {compressed_tokens(done):,} tokens"
            )
            self.app.out.console.print(self.meter.renderable())

    def greet(self) -> None:
        where = f"session {self.session_id}" if self.session_id else "a new session"
        self.say(f"pal chat · {where} · /help for commands")
        if not self.session_id or self.app.out.json:
            return
        store = self.app.conn.store()
        page = store.GetHistoryPage(pb.GetHistoryPageRequest(session_id=self.session_id, limit=RESUME_MESSAGES))
        for message in page.messages:
            self.app.out.console.print(message_view(message, brief=True))

    # -- turns -----------------------------------------------------------------------------------
    def send(self, text: str) -> StreamResult:
        self.after_turn_news()  # a compression after the last answer, if one came while this was typed
        images = list(self.images)
        for path in image_paths_in(text):
            images.append(path.read_bytes())
            self.say(f"sending image {path}")
        request = agent_pb2.RunStreamRequest(
            session_id=self.session_id,
            profile_id=self.profile_id if self.profile_pending else "",
            text=text,
            images=images,
            external_refs=self.refs,
            attachments=self.attachments,
        )
        declare(request, self.tools)
        agent = self.app.conn.agent()
        renderer = renderer_for(self.app.out, self.meter)
        try:
            result = stream_turn(
                agent,
                lambda: agent.RunStream(request),
                renderer,
                self.session_id,
                tools=runner_for(agent, self.tools, renderer.note),
            )
        except ServiceError:
            if renderer.outcome.session_id:  # cut off mid-turn, but it began: the session has the message
                self._sent(renderer.outcome.session_id)
            raise
        self._sent(result.outcome.session_id)
        return result

    def _sent(self, session_id: str) -> None:
        """What was sent is now in the session, even when the turn was stopped or cut off; the next
        message goes to the same session (a new one's id came with the turn's first event)."""
        self.images.clear()
        self.attachments.clear()
        self.profile_pending = False
        self.refs.clear()
        self.session_id = session_id or self.session_id

    def compact(self) -> None:
        if not self.session_id:
            self.say("nothing to compact yet: this session has no messages")
            return
        agent = self.app.conn.agent()
        request = agent_pb2.CompactRequest(session_id=self.session_id)
        try:
            stream_turn(
                agent,
                lambda: agent.Compact(request),
                renderer_for(self.app.out, self.meter, "compressing the context"),
                self.session_id,
                require_end=False,
            )
        except ServiceError as err:
            if err.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            self.say(nothing_to_compact(err.details or str(err)))

    # -- slash commands --------------------------------------------------------------------------
    def command(self, name: str, rest: str) -> bool:
        """Run one slash command; False means leave."""
        if name in ("exit", "quit", "q"):
            return False
        if name in ("help", "?"):
            self.say(HELP, "")
        elif name == "new":
            self.session_id, self.meter, self.images, self.attachments = "", ContextMeter(), [], []
            self.say("new session: your next message starts it")
        elif name == "compact":
            self.compact()
        elif name == "profile":
            self.switch_profile(rest)
        elif name == "attach":
            self.attach(rest)
        elif name == "image":
            self.add_image(rest)
        elif name == "id":
            self.say(self.session_id or "no session yet: your next message starts one", "")
        else:
            self.say(f"unknown command /{name}: /help lists them", "yellow")
        return True

    def switch_profile(self, profile_id: str) -> None:
        response = self.app.conn.agent().ListProfiles(agent_pb2.ListProfilesRequest())
        known = {p.id: p for p in response.profiles}
        if not profile_id:
            current = self.profile_id or f"{response.default_profile_id} (default)"
            self.say(f"profile: {current} · available: {', '.join(known)}", "")
            return
        if profile_id not in known:
            self.say(f"no profile {profile_id!r}: available are {', '.join(known)}", "yellow")
            return
        self.profile_id = profile_id
        self.profile_pending = True
        self.say(f"using profile {profile_id} ({known[profile_id].model}) from your next message", "")

    def ensure_session(self) -> str:
        """Files belong to a session: create it now when the conversation has not started yet."""
        if not self.session_id:
            self.session_id = new_session(self.app, self.profile_id)
            self.say(f"started session {self.session_id}")
        return self.session_id

    def _read(self, raw: str) -> tuple[Path, bytes] | None:
        if not raw:
            self.say("which file? e.g. /image photo.png", "yellow")
            return None
        path = Path(raw.strip("'\"")).expanduser()
        try:
            return path, path.read_bytes()
        except OSError as err:
            self.say(f"cannot read {path}: {err.strerror or err}", "yellow")
            return None

    def attach(self, raw: str) -> None:
        if not raw:
            self.say("which file? e.g. /attach notes.txt", "yellow")
            return
        try:
            local = local_file(raw)
        except CliError as err:
            self.say(str(err), "yellow")
            return
        info = upload(self.app, self.ensure_session(), local)
        self.attachments.append(info.name)
        self.say(f"attached {raw.strip()} as {info.name} ({info.size:,} bytes); it goes with your next message")

    def add_image(self, raw: str) -> None:
        read = self._read(raw)
        if read is None:
            return
        path, data = read
        self.images.append(data)
        self.say(f"image {path} will be sent with your next message")


def chat(app: App, args: argparse.Namespace) -> int:
    if args.session_id:
        # Fail early, with the store's message, on an id that does not exist.
        app.conn.store().GetSession(pb.GetSessionRequest(session_id=args.session_id, view=pb.SESSION_VIEW_SUMMARY))
    return Chat(
        app, session_id=args.session_id, profile_id=args.profile, refs=list(args.refs), tools=args.client_tools
    ).loop()
