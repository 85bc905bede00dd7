"""One authenticated connection after the handshake: sealed sends from a queue, checked receives.

Sends never block the caller: a message is sealed and queued, and the channel's own thread
writes it with a timeout, so one peer that stops reading (a stalled launcher, a full network
buffer) delays no one else and holds no lock; after ``dead_after`` seconds without progress, or
``queue_limit`` messages waiting, the channel gives up on it. Receives wait at most ``dead_after``
seconds for the next line; heartbeats both ways keep a healthy connection from ever being that
quiet, so silence means the peer froze or the network between the nodes failed.
"""

from __future__ import annotations

import queue
import socket
import threading

from tfstrategy.launch.rendezvous.handshake import Opener, Sealer
from tfstrategy.launch.rendezvous.wire import (
    MAX_LINE,
    LineReader,
    Message,
    ProtocolError,
)

__all__ = ["Channel", "ChannelClosed"]


class ChannelClosed(Exception):
    """The channel ended: why, as a phrase about the peer, and whether the peer broke the protocol."""

    def __init__(self, reason: str, *, broken: bool = False, silent: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.broken, self.silent = reason, broken, silent


class Channel:
    """A socket after the handshake, in both directions.

    Args:
        sock: the connected socket.
        reader: the handshake's reader (it may already hold the peer's first sealed line).
        peer: ``host:port``, for messages.
        sealer, opener: this connection's two directions.
        dead_after: seconds of silence (or of a send not progressing) after which the peer is dead.
        queue_limit: messages waiting to be sent before the peer counts as not reading.
    """

    def __init__(self, sock: socket.socket, reader: LineReader, peer: str, *, sealer: Sealer, opener: Opener,
                 dead_after: float, queue_limit: int = 256) -> None:
        self.sock, self.peer, self.dead_after, self.queue_limit = sock, peer, dead_after, queue_limit
        self._reader, self._sealer, self._opener = reader, sealer, opener
        reader.limit = MAX_LINE
        sock.settimeout(dead_after)
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self._lock = threading.RLock()
        self._closed = False
        self._shut = False
        #: Why sending failed, once it did.
        self.failure: str | None = None
        self._writer = threading.Thread(target=self._write_loop, daemon=True, name=f"rendezvous-send {peer}")

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        """Start sending (queued messages go first)."""
        self._writer.start()

    def send(self, message: Message) -> bool:
        """Queue ``message``; false when the channel is closed (or just gave up on the peer)."""
        with self._lock:
            if self._closed:
                return False
            if self._queue.qsize() >= self.queue_limit:
                self.failure = f"did not read its messages ({self.queue_limit} waiting)"
                self._close_locked(None)
                return False
            self._queue.put(self._sealer.seal(message))
            return True

    def _write_loop(self) -> None:
        while True:
            data = self._queue.get()
            if data is None:
                break
            try:
                self.sock.sendall(data)
            except TimeoutError:
                self.failure = f"read nothing of its messages for {self.dead_after:g} s (stalled)"
                break
            except OSError as error:
                self.failure = self.failure or f"the connection failed ({error.strerror or type(error).__name__})"
                break
        with self._lock:
            self._closed = True
        self._shutdown()

    def receive(self) -> Message:
        """The peer's next message.

        Raises:
            ChannelClosed: the peer closed, went silent, failed, or sent a message that is not
                authentic, in sequence and valid. The owner then closes the channel (with a last
                word for the peer if it likes).
        """
        try:
            line = self._reader.read_line(idle=self.dead_after)
            if line is None:
                raise ChannelClosed(self.failure or "closed the connection")
            return self._opener.open(line)
        except TimeoutError:
            raise ChannelClosed(f"sent nothing for {self.dead_after:g} s (its launcher is frozen or was stopped, "
                                "or the network between the nodes failed)", silent=True) from None
        except ProtocolError as error:
            raise ChannelClosed(str(error), broken=True) from None
        except OSError as error:
            raise ChannelClosed(self.failure or f"the connection failed ({error.strerror or type(error).__name__})") \
                from None

    def close(self, final: Message | None = None, *, flush: bool = False) -> None:
        """Close without blocking; ``final`` is the last message the peer gets, and with ``flush``
        (or a ``final``) what is queued is sent first (best effort, within the send timeout)."""
        with self._lock:
            self._close_locked(final, flush=flush)

    def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for a flushing close to have sent everything, then shut the socket."""
        if self._writer.is_alive():
            self._writer.join(timeout)
        self._shutdown()

    def _close_locked(self, final: Message | None, *, flush: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if final is not None:
            self._queue.put(self._sealer.seal(final))
        self._queue.put(None)  # the writer stops there, and shuts the socket
        if not (flush or final is not None) or not self._writer.is_alive():
            self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            if self._shut:
                return
            self._shut = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
        except OSError:
            pass
        self.sock.close()
