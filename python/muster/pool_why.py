"""Why a ``muster.Pool`` call ran out of time while its head answered: the errors of its
jobs that failed and wait to be tried again.  A job that fails on every attempt (a shared
level it requires that was never uploaded, say) gives no result until its attempts are
spent, so a call's TimeoutError named only the session and the results not read; it now
says what the jobs keep failing with.  See pool.py (``_timed_out_reading``)."""
from . import errors

JOBS_PAGE = 100   # tasks read (one page, brief) to find the call's failing jobs
ERRORS_SHOWN = 3  # distinct errors named in the message, the newest first


def failing_jobs_note(client, queue, session, first_id, first, n):
    """"; N of this call's unfinished jobs failed at least once and wait to be tried again,
    the newest first: job I (attempt A): ERROR; ..." for the jobs of ``session`` at session
    indexes ``first``..``first + n - 1`` (the first of their tasks has id ``first_id``), of
    the first JOBS_PAGE tasks from there; "" when none has failed, or when they cannot be
    read (the timeout is said all the same)."""
    if first_id is None:
        return ""
    try:
        page = client.tasks(queue, after=first_id - 1, limit=JOBS_PAGE, brief=True)["tasks"]
    except (errors.MusterError, KeyError, TypeError):
        return ""
    failing = [t for t in page if t.get("session") == session and t.get("error")
               and t.get("state") in ("queued", "leased")
               and isinstance(t.get("index"), int) and first <= t["index"] < first + n]
    if not failing:
        return ""
    failing.sort(key=lambda t: (t.get("updated_ms") or 0, t["id"]), reverse=True)
    shown, said = [], set()
    for t in failing:
        if t["error"] not in said and len(shown) < ERRORS_SHOWN:
            said.add(t["error"])
            shown.append("job %d (attempt %d): %s" % (t["index"] - first, t.get("attempts") or 0,
                                                      t["error"]))
    more = len(failing) - len(shown)
    others = sum(1 for t in failing if t["error"] not in said)   # errors not named
    tail = ""
    if more and not others:
        tail = " (and %d more with these errors)" % more
    elif more:
        tail = " (and %d more: %d with these errors, %d with others)" % (more, more - others,
                                                                         others)
    return ("; %d of this call's unfinished jobs failed at least once and wait to be tried "
            "again, the newest first: %s%s" % (len(failing), "; ".join(shown), tail))
