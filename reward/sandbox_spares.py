"""Spare processes: forked before any request exists, handed to the host on demand.

Stdlib only (prepended, after the codec, to the zygote's and the judge's
sources). A server keeps one spare ready: it forks it, passes the host one end
of a socket whose other end the spare holds (over the SOCK_SEQPACKET control
socket, with SCM_RIGHTS), forks the next one when the host says "more", and
reports each child's exit status. The host talks to a spare directly, so the
server never reads a request and stays off the critical path of a run. When its
control socket closes (the host is gone), the server kills every spare it made,
those running a program included, before it exits: no run outlives its host.
"""

import os
import select
import signal
import socket


def make_spare(control, child, fork=os.fork):
    """Fork a spare running `child(sock)` with `fork` (the zygote's puts it in a new pid namespace). Returns its pid."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = fork()
    if pid == 0:
        control.close()
        mine.close()
        try:
            child(theirs)
        finally:
            os._exit(70)
    theirs.close()
    socket.send_fds(control, [frame({"op": "spare", "pid": pid})[4:]], [mine.fileno()])
    mine.close()
    return pid


def serve_spares(control, child, fork=os.fork, reaped=None):
    """A server's loop: a new spare whenever the host takes one, and the exit status of each
    (then `reaped(pid)`, if given)."""
    by_fd, by_pid = {}, {}
    poller = select.poll()
    poller.register(control.fileno(), select.POLLIN)

    def spare():
        pid = make_spare(control, child, fork)
        fd = os.pidfd_open(pid)
        by_fd[fd], by_pid[pid] = pid, fd
        poller.register(fd, select.POLLIN)

    def reap():
        """Reap every exited child (orphans of a run included) and report the spares among them."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = by_pid.pop(pid, None)
            if fd is None:
                continue
            del by_fd[fd]
            poller.unregister(fd)
            os.close(fd)
            reply = {"op": "exit", "pid": pid, "exit": None, "signal": None}
            if os.WIFSIGNALED(status):
                reply["signal"] = os.WTERMSIG(status)
            else:
                reply["exit"] = os.WEXITSTATUS(status)
            control.send(frame(reply)[4:])
            if reaped is not None:
                reaped(pid)

    spare()
    try:
        while True:
            for fd, _ in poller.poll():
                if fd == control.fileno():
                    try:
                        data = control.recv(1 << 16)
                    except OSError:
                        return
                    if not data:
                        return
                    if loads(data).get("op") == "more":
                        spare()
                elif fd in by_fd:
                    reap()
    finally:
        for fd in by_fd:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
