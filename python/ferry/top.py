"""``python -m ferry.top PID``: a live view of a running trainer's ferry
loaders, from another shell.

It attaches to the local socket a trainer opens when its loaders are live
(``ferry.Loader(..., live=True)``, or ``FERRY_LIVE=1`` in its environment;
the server is ferry/_live.py, which also describes the lines it sends),
and redraws one screen a second: for each loader its rate, how much of
its time the trainer waits, the verdict, the stages (mean, p50, p99 over
the last few seconds) and a row per worker (local pid, or remote host).
Nothing it does reaches the trainer but reading that socket: detaching
('q', Ctrl-C, or closing the terminal) leaves the training as it was.

The screen is plain ANSI on the terminal's alternate screen, sized to the
terminal at every redraw: 80x24 shows a loader with up to ten workers in
full; a smaller one drops the mean row, then the stage table, then the
workers past what fits, and says so. Not on a terminal (a pipe, a log)
it prints each screen one after the other; ``--once`` prints the first
full one and exits; ``--json`` passes the server's lines through.

Exit status: 0 detached, or the loaders closed (a last line says so);
1 no such process, or it ended without closing them; 2 usage; 3 the
process has no live loader; 4 refused (another user's trainer).
"""

import argparse
import json
import os
import select
import signal
import socket
import sys
import termios
import textwrap
import time
import tty

from ._live import VERSION, address

HELLO_TIMEOUT_S = 5.0  # the server answers at once; a trainer stuck that long is said to be
STAGES = ("make", "transit", "order", "held", "wait", "step")
EXIT_NO_PROCESS, EXIT_USAGE, EXIT_NOT_LIVE, EXIT_REFUSED = 1, 2, 3, 4


class Ended(Exception):
    """The view is over: ``status`` to exit with, ``line`` to print last."""

    def __init__(self, status, line):
        super().__init__(line)
        self.status, self.line = status, line


# ---------------------------------------------------------------------------
# Attaching


def _command_line(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return " ".join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        return "?"


def attach(pid):
    """A socket attached to process ``pid``'s live view and the server's
    hello; raises Ended with the sentence for each way it cannot be."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise Ended(EXIT_NO_PROCESS, "ferry top: no process %d" % pid) from None
    except PermissionError:
        pass  # another user's: it exists; its socket (if any) decides
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address(pid))
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        raise Ended(EXIT_NOT_LIVE,
                    "ferry top: process %d (%s) has no live ferry loader: open its loaders with "
                    "live=True, or start it with FERRY_LIVE=1 in its environment"
                    % (pid, _command_line(pid))) from None
    reader = Lines(sock)
    hello = reader.next(HELLO_TIMEOUT_S)
    if hello is None or "refused" in hello or "closed" in hello:
        sock.close()
        if hello is None:
            raise Ended(EXIT_NO_PROCESS, "ferry top: process %d did not answer within %.0f s"
                        % (pid, HELLO_TIMEOUT_S))
        if "refused" in hello:
            raise Ended(EXIT_REFUSED, "ferry top: process %d refused to be watched: %s"
                        % (pid, hello["refused"]))
        raise Ended(0, "ferry top: %s" % hello["closed"])
    if hello.get("version") != VERSION:
        sock.close()
        raise Ended(EXIT_NOT_LIVE, "ferry top: process %d speaks live view version %s, this "
                    "ferry reads %d" % (pid, hello.get("version"), VERSION))
    return sock, reader, hello


class Lines:
    """JSON lines from the server's socket."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.eof = False

    def pending(self):
        """The next whole line already read, or None. A line that is not
        JSON (the server dropped this client mid-line: it read too slowly)
        ends the stream."""
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            self.buf, self.eof = b"", True
            return None

    def feed(self):
        """Reads what the socket has (it is readable); False at its end."""
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def next(self, timeout):
        """The next line, waiting at most ``timeout`` seconds; None at the
        end of the stream or the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.pending()
            if line is not None or self.eof:
                return line
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return None
            self.feed()


# ---------------------------------------------------------------------------
# The screen: a pure function of what the server said and the terminal's size


def _ms(seconds):
    ms = seconds * 1e3
    return "%.3f" % ms if ms < 100 else "%.1f" % ms if ms < 10000 else "%.0f" % ms


def _duration(s):
    s = int(s)
    return "%d:%02d:%02d" % (s // 3600, s // 60 % 60, s % 60)


def _count(n):
    return "%.0f" % n if n >= 100 else "%.1f" % n


def _loader_lines(ld, width, level):
    """One loader's lines at a level of detail: 0 everything, 1 without
    the mean row and with a one-line verdict, 2 without the stage table
    too, 3 the heading, the rate and the verdict's kind only. Returns the
    lines and how many come before the worker table."""
    head = "loader %d  %s" % (ld["loader"], ld["dataset"])
    up = "%s batches, up %s" % (format(ld["delivered"], ","), _duration(ld["up"]))
    if len(head) + len(up) + 2 > width:
        head = head[:max(0, width - len(up) - 5)] + "..."
    lines = [head + " " * max(2, width - len(head) - len(up)) + up]
    rate = "  %s batches/s  %s items/s  trainer waits %.0f%%  workers %d  in flight %d/%d" % (
        _count(ld["rate"]), _count(ld["rate"] * ld["batch_size"]), ld["wait_share"] * 100,
        ld["workers_ready"], ld["in_flight"], ld["prefetch"])
    if ld["restarts"] or ld["lost"]:
        rate += "  restarts %d  lost %d" % (ld["restarts"], ld["lost"])
    lines.append(rate)
    if level >= 3:
        lines.append("  " + ld["kind"])
        return lines, len(lines)
    wrap = textwrap.wrap(ld["verdict"], max(20, width - 4)) or [""]
    if level >= 1 and len(wrap) > 1:
        wrap = [wrap[0].rstrip(",;:") + " ..."]
    lines += ["  " + w for w in wrap]
    if level <= 1:
        span = "since open, %.0f s" % ld["span"] if ld["since_open"] else \
            "last %.0f s" % ld["span"]
        lines.append("  %-11s" % ("ms") + "".join("%9s" % s for s in STAGES) + "   (%s)" % span)
        for row in (("mean", "p50", "p99") if level == 0 else ("p50", "p99")):
            lines.append("  %-11s" % row + "".join(
                "%9s" % _ms(ld["stages"][s][row]) for s in STAGES))
    head = len(lines)
    lines.append("  %-6s %-22s %10s %5s %9s %9s" % ("worker", "pid / host", "batches/s",
                                                    "busy", "make p50", "transit"))
    for w in ld["workers"]:
        if w["where"] == "remote":
            where = "%s:%s" % (w["host"], w["pid"]) if w.get("host") else "remote"
        elif w["where"] == "thread":
            where = "thread"
        else:
            where = str(w["pid"]) if w.get("pid") else "(restarting)"
        lines.append("  %-6d %-22s %10s %4.0f%% %9s %9s" % (
            w["worker"], where[:22], _count(w["rate"]), w["busy"] * 100, _ms(w["make_p50"]),
            _ms(w["transit"])))
    if not ld["workers"]:
        lines.append("  (no batch delivered in this span)")
    return lines, head


def render(hello, snap, width, height):
    """The screen: at most ``height`` lines of at most ``width`` characters,
    as much detail as fits (see _loader_lines)."""
    width, height = max(width, 20), max(height, 3)
    clock = time.strftime("%H:%M:%S", time.localtime(snap["time"]))
    title = "ferry top  pid %d  %s" % (hello["pid"], " ".join(hello.get("argv") or []))
    right = "%s  q: quit" % clock
    if width < 40:
        right = ""
    if len(title) + len(right) + 2 > width:
        title = title[:max(9, width - len(right) - 5)] + "..."
    top = (title + " " * max(2, width - len(title) - len(right)) + right).rstrip()
    loaders = snap["loaders"]
    if not loaders:
        body = ["(no open live loader at the moment)"]
    else:
        # The most detail that fits; workers past the screen are cut below
        # (and counted) unless not even the loaders' headings fit.
        for level in range(3):
            parts = [_loader_lines(ld, width, level) for ld in loaders]
            body = [line for lines, _ in parts for line in lines]
            if len(body) + 1 <= height:
                break
        else:
            if sum(head for _, head in parts) + 1 > height:
                body = [line for ld in loaders for line in _loader_lines(ld, width, 3)[0]]
    lines = [top] + body
    if len(lines) > height:
        cut = len(lines) - height + 1
        lines = lines[:height - 1] + ["... %d more lines: a taller terminal shows them" % cut]
    return [line[:width] for line in lines]


# ---------------------------------------------------------------------------
# The terminal


class Screen:
    """The alternate screen with the cursor hidden and keys read one by
    one (cbreak: Ctrl-C still interrupts); all undone by close()."""

    def __init__(self, out, keys):
        self.out, self.keys = out, keys
        self.saved = None
        if keys is not None:
            self.saved = termios.tcgetattr(keys)
            tty.setcbreak(keys)
        out.write("\x1b[?1049h\x1b[?25l")
        out.flush()

    def draw(self, lines):
        self.out.write("\x1b[H" + "".join(line + "\x1b[K\r\n" for line in lines[:-1]) +
                       (lines[-1] + "\x1b[K" if lines else "") + "\x1b[J")
        self.out.flush()

    def close(self):
        self.out.write("\x1b[?25h\x1b[?1049l")
        self.out.flush()
        if self.saved is not None:
            termios.tcsetattr(self.keys, termios.TCSADRAIN, self.saved)


def _size(fd):
    try:
        size = os.get_terminal_size(fd)
        return size.columns, size.lines
    except OSError:
        return 80, 24


def watch(pid, sock, reader, hello, out=sys.stdout, once=False, raw=False):
    """Shows the stream until it ends or the user leaves; raises Ended."""
    tty_out = out.isatty() and not raw and not once
    keys = sys.stdin.fileno() if tty_out and sys.stdin.isatty() else None
    screen = Screen(out, keys) if tty_out else None
    resized = []
    old_winch = signal.signal(signal.SIGWINCH, lambda *a: resized.append(1)) if tty_out else None
    last = None
    try:
        if raw:
            out.write(json.dumps(hello) + "\n")
        while True:
            snap = reader.pending()
            if snap is None and not reader.eof:
                fds = [sock] + ([keys] if keys is not None else [])
                ready = select.select(fds, [], [], 1.0)[0]
                if keys in ready:
                    key = os.read(keys, 32)
                    if b"q" in key.lower():
                        raise Ended(0, "ferry top: detached from process %d" % pid)
                    if key.strip(b" \r\n") == b"" or b"r" in key.lower():
                        sock.sendall(b"snapshot\n")  # a fresh screen now
                if sock in ready:
                    reader.feed()
                if resized and last is not None:
                    del resized[:]
                    screen.draw(render(hello, last, *_size(out.fileno())))
                continue
            if snap is None:  # the socket ended without a word
                alive = os.path.exists("/proc/%d" % pid)
                raise Ended(EXIT_NO_PROCESS, "ferry top: process %d %s" % (
                    pid, "stopped its live view" if alive else
                    "ended without closing its loaders"))
            if "closed" in snap:
                delivered = ", ".join("loader %d delivered %d batches" % (ld["loader"],
                                                                           ld["delivered"])
                                      for ld in (last or {}).get("loaders", []))
                raise Ended(0, "ferry top: %s%s" % (snap["closed"],
                                                    " (%s)" % delivered if delivered else ""))
            if raw:
                out.write(json.dumps(snap) + "\n")
                out.flush()
                continue
            last = snap
            if once:
                if snap["loaders"] and all(ld["batches"] for ld in snap["loaders"]):
                    out.write("\n".join(render(hello, snap, 80, 1000)) + "\n")
                    raise Ended(0, None)
                continue  # the first screens may have no batch in their span yet
            if screen is not None:
                screen.draw(render(hello, snap, *_size(out.fileno())))
            else:
                out.write("\n".join(render(hello, snap, 80, 1000)) + "\n\n")
                out.flush()
    except KeyboardInterrupt:
        raise Ended(0, "ferry top: detached from process %d" % pid) from None
    finally:
        if screen is not None:
            screen.close()
        if tty_out:
            signal.signal(signal.SIGWINCH, old_winch)
        sock.close()


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m ferry.top",
        description="A live view of a running trainer's ferry loaders (opened with live=True "
                    "or FERRY_LIVE=1): workers and hosts, rate, stages, the verdict, each "
                    "second. q or Ctrl-C detaches; the trainer goes on as it was.")
    parser.add_argument("pid", type=int, help="the trainer's process id")
    parser.add_argument("--once", action="store_true",
                        help="print one screen (the first with batches in it) and exit")
    parser.add_argument("--json", action="store_true",
                        help="print the trainer's JSON lines as they come")
    args = parser.parse_args(argv)
    try:
        sock, reader, hello = attach(args.pid)
        watch(args.pid, sock, reader, hello, once=args.once, raw=args.json)
    except KeyboardInterrupt:  # before the screen was up
        print("ferry top: detached from process %d" % args.pid)
        return 0
    except Ended as e:
        if e.line:
            print(e.line, file=sys.stderr if e.status else sys.stdout)
        return e.status
    return 0


if __name__ == "__main__":
    sys.exit(main())
