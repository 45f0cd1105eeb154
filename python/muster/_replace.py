"""Files written whole, then put in place: the bytes go to a temporary file beside the
destination (the same directory, so the same file system), which is renamed over it, so
that a reader or a crash finds the old file or the new one, never a part of one.

What ends up there is what ``open(path, "w")`` would have written, as ``cp`` does: a
symbolic link is written through, to the file it points to (a dangling link's target is
created, the link kept), and the file keeps the permission bits of the one it replaces,
or, new, gets 0666 less the umask.  Being a new file, it is owned by the writer.  A
device or a FIFO (``/dev/null``, a named pipe) cannot be replaced by a file: it is
written into, as open() writes into it (``written_into``).
"""
import errno
import os
import stat


def destination(path):
    """The file that writing ``path`` writes: an absolute path, its symbolic links
    followed as open() follows them, to the end (a dangling link's target included).
    A loop of links raises OSError (ELOOP), as open() does."""
    real = os.path.realpath(path)
    if os.path.islink(real):  # realpath leaves a loop where it found it
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fspath(path))
    return real


def written_into(dest):
    """Whether ``dest`` (as ``destination`` gives) is a device or a FIFO, to be opened
    and written into rather than replaced (replacing /dev/null with a file, as root,
    would break every program that writes to it)."""
    try:
        mode = os.stat(dest).st_mode
    except FileNotFoundError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)


def create_beside(dest, suffix):
    """A new file beside ``dest`` (an absolute path, as ``destination`` gives) to be
    renamed over it: ``(fd open for writing, its path)``, named ``.NAME.XXXXXXXX`` +
    ``suffix``.  Its mode is what open() would give ``dest``: the permission bits of the
    file there, else 0666 less the umask.  OSError when it cannot be made."""
    directory, base = os.path.split(dest)
    while True:
        path = os.path.join(directory, ".%s.%s%s" % (base, os.urandom(4).hex(), suffix))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        break
    try:
        try:
            mode = stat.S_IMODE(os.stat(dest).st_mode) & 0o777
        except FileNotFoundError:
            return fd, path   # new: 0666 less the umask, from os.open
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return fd, path
