"""Where a client finds its head: the URL and token as the CLI finds them (the
argument, the environment, the head's data dir), and what keeps a URL from naming one.
``muster.client`` and the package import these names from here."""
import os
import re

DEFAULT_URL = "http://127.0.0.1:7370"
DEFAULT_DATA_DIR = "muster-data"


def _read_data_file_why(data_dir, name):
    """The first line of DATA_DIR/name, stripped, and None; or None and why it gave none."""
    try:
        with open(os.path.join(data_dir, name)) as f:
            line = f.readline().strip()
    except OSError as e:
        return None, e.strerror or str(e)
    return (line, None) if line else (None, "it is empty")


def _read_data_file(data_dir, name):
    return _read_data_file_why(data_dir, name)[0]


def data_dir_default(data_dir=None):
    """The head's data dir as the CLI finds it: the argument, $MUSTER_DATA_DIR, ./muster-data."""
    return data_dir or os.environ.get("MUSTER_DATA_DIR") or DEFAULT_DATA_DIR


def _resolve_url_from(url=None, data_dir=None):
    """The URL as the CLI finds it, and what gave it ("url", "MUSTER_URL", a file's path,
    "the default URL").  A data dir that was named (``data_dir``, $MUSTER_DATA_DIR) but
    has no url file raises ValueError, as the CLI refuses it: the default URL instead
    might be another head's."""
    if url:
        return url, "url"
    if os.environ.get("MUSTER_URL"):
        return os.environ["MUSTER_URL"], "MUSTER_URL"
    named = "data_dir" if data_dir else "MUSTER_DATA_DIR" if os.environ.get("MUSTER_DATA_DIR") else None
    found, why = _read_data_file_why(data_dir_default(data_dir), "url")
    path = os.path.join(data_dir_default(data_dir), "url")
    if found:
        return found, path
    if named:
        raise ValueError("%s '%s' has no url file (%s: %s), which a head writes while it runs: "
                         "start the head with this data dir, name the data dir of a running "
                         "head, or pass url= (or set MUSTER_URL)"
                         % (named, data_dir_default(data_dir), path, why))
    return DEFAULT_URL, "the default URL"


def resolve_url(url=None, data_dir=None):
    """url, else $MUSTER_URL, else DATA_DIR/url, else http://127.0.0.1:7370 when no data dir
    was named (like the CLI; a named one without a url file raises ValueError)."""
    return _resolve_url_from(url, data_dir)[0]


def url_problem(url):
    """What keeps ``url`` from naming a head, in the CLI's words (src/core/url.c), or None:
    http:// or https://, a host, an optional port from 1 to 65535, no query or fragment,
    and no path ending in /v1 (the client adds /v1/... itself)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else None
    if scheme not in ("http", "https"):
        return "it must start with http:// or https://"
    rest = url.split("://", 1)[1]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    path = rest[len(authority):]
    host = authority.split("@", 1)[1] if "@" in authority else authority
    if host.startswith("["):  # an IPv6 literal
        close = host.find("]")
        if close <= 1:
            return "it names no host"
        port = host[close + 1:]
    else:
        port = host[len(re.split(r"[:/?#]", host, maxsplit=1)[0]):]
        if port == host:
            return "it names no host"
    if port and not port.startswith(":"):
        return "it names no host"
    if port and not (re.fullmatch(r"[0-9]{1,5}", port[1:]) and 1 <= int(port[1:]) <= 65535):
        return "its port must be a number from 1 to 65535"
    if "?" in path or "#" in path:
        return "it may not have a query or a fragment"
    if path.rstrip("/").endswith("/v1"):
        return "it must not end in /v1: give the head's address alone (the client adds /v1/...)"
    return None


def resolve_token(token=None, data_dir=None):
    """token, else $MUSTER_TOKEN, else DATA_DIR/token, else None (like the CLI)."""
    return token or os.environ.get("MUSTER_TOKEN") or _read_data_file(data_dir_default(data_dir), "token")


def token_looked(data_dir=None):
    """Where a client looked for a token and found none, in the CLI's words: "not by
    token=, not by MUSTER_TOKEN, and not in muster-data/token (No such file or directory,
    from the default data dir)"."""
    named = ("data_dir=" if data_dir else "MUSTER_DATA_DIR" if os.environ.get("MUSTER_DATA_DIR")
             else "the default data dir")
    path = os.path.join(data_dir_default(data_dir), "token")
    why = _read_data_file_why(data_dir_default(data_dir), "token")[1] or "it gave none"
    return "not by token=, not by MUSTER_TOKEN, and not in %s (%s, from %s)" % (path, why, named)


def no_head_advice(source, server=None):
    """What to do when no connection could be made to a URL that ``source`` gave (the
    second value of _resolve_url_from, or "--url" for a command's option), as the CLI says
    it: a URL given is the user's to check; a data dir's url file outlives a head killed
    with -9; the default URL was a guess.  ``server`` is what earlier replies of the same
    client said answers there ("head", "node": a node agent; Client.server); unknown, the
    question names both, unless the URL came from a head's url file."""
    from_file = source not in ("url", "--url", "MUSTER_URL", "the default URL")
    if server is None and from_file:
        server = "head"   # a head writes that file
    who = {"head": "the head", "node": "the node agent"}.get(server, "a muster head or node agent")
    if source in ("url", "--url", "MUSTER_URL"):
        return ("is %s running there? The URL is the one %s gives: start %s, or give the URL "
                "of a running one" % (who, "url=" if source == "url" else source,
                                      "the head" if server == "head" else "it"))
    if source == "the default URL":
        return ("is %s running there? No URL was given and %s has no url file, so the "
                "default URL was tried: start a head (muster head, or muster.start_head()), "
                "pass url= (or set MUSTER_URL), or name a running head's data dir with "
                "data_dir= (or MUSTER_DATA_DIR)" % (who, os.path.join(".", DEFAULT_DATA_DIR)))
    return ("is %s running there? The URL was read from %s, which a head writes when it "
            "listens and leaves behind when it is killed: start that head again, or pass url= "
            "(or set MUSTER_URL)" % (who, source))
