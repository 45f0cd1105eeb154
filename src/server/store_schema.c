/*
 * store_schema.c — the schema of the head's store, as the migrations that
 * build it in order: migration N brings PRAGMA user_version from N to N + 1
 * (store.c runs those a file has not seen, each in its own transaction).
 *
 * A migration is never edited once released: a store made by it is out
 * there.  A change to the schema is a new migration at the end, whose
 * comment says what changed and why, so that this file reads as the
 * schema's history; the tables' own contracts live in the files that own
 * them (named in each comment).
 */
#include "store_schema.h"

#include <stddef.h>

const char *const store_migrations[] = {
    "CREATE TABLE queues ("
    "  name TEXT PRIMARY KEY, lease_ms INTEGER NOT NULL, max_attempts INTEGER NOT NULL,"
    "  backoff_ms INTEGER NOT NULL, backoff_max_ms INTEGER NOT NULL, next TEXT,"
    "  max_flags INTEGER NOT NULL, created_ms INTEGER NOT NULL);"
    "CREATE TABLE tasks ("
    "  id INTEGER PRIMARY KEY, queue TEXT NOT NULL, state INTEGER NOT NULL,"
    "  priority INTEGER NOT NULL, run_at_ms INTEGER NOT NULL, payload TEXT NOT NULL,"
    "  result TEXT, error TEXT, attempts INTEGER NOT NULL DEFAULT 0,"
    "  flags INTEGER NOT NULL DEFAULT 0, key TEXT, session TEXT, idx INTEGER,"
    "  parent INTEGER, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL,"
    "  token INTEGER, worker INTEGER, deadline_ms INTEGER);"
    "CREATE INDEX tasks_ready ON tasks(queue, priority DESC, id) WHERE state = 0;"
    "CREATE INDEX tasks_leased ON tasks(deadline_ms) WHERE state = 1;"
    "CREATE INDEX tasks_by_worker ON tasks(worker) WHERE state = 1;"
    "CREATE INDEX tasks_by_state ON tasks(queue, state, id);"
    "CREATE UNIQUE INDEX tasks_key ON tasks(queue, key) WHERE key IS NOT NULL;"
    "CREATE TABLE workers ("
    "  id INTEGER PRIMARY KEY, name TEXT NOT NULL, nickname TEXT NOT NULL, node TEXT,"
    "  queues TEXT, labels TEXT, state INTEGER NOT NULL, progress TEXT,"
    "  last_seen_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL,"
    "  timeout_ms INTEGER NOT NULL, completed INTEGER NOT NULL DEFAULT 0,"
    "  failed INTEGER NOT NULL DEFAULT 0, flagged INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX workers_active ON workers(state, last_seen_ms);"
    "CREATE TABLE meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);",
    /* Coordinated iterations (iter.c): one row each; its ranks; the blocks of
     * its current epoch that were ever leased; the next fresh block per lane. */
    "CREATE TABLE iterations ("
    "  id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, config TEXT NOT NULL, origin TEXT,"
    "  fingerprint TEXT NOT NULL, lease_ms INTEGER NOT NULL, rank_timeout_ms INTEGER NOT NULL,"
    "  replication INTEGER NOT NULL, slow_ratio REAL NOT NULL, cluster_sync INTEGER NOT NULL,"
    "  epoch INTEGER NOT NULL, done_blocks INTEGER NOT NULL, finished INTEGER NOT NULL,"
    "  resume_epoch INTEGER, resume_world INTEGER, resume_done TEXT,"
    "  created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL);"
    "CREATE TABLE iter_ranks ("
    "  iter INTEGER NOT NULL, rank INTEGER NOT NULL, state INTEGER NOT NULL,"
    "  last_seen_ms INTEGER NOT NULL, deadline_ms INTEGER NOT NULL, first_ms INTEGER,"
    "  samples INTEGER NOT NULL DEFAULT 0, blocks INTEGER NOT NULL DEFAULT 0,"
    "  taken_over INTEGER NOT NULL DEFAULT 0, expired INTEGER NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (iter, rank)) WITHOUT ROWID;"
    "CREATE INDEX iter_ranks_due ON iter_ranks(deadline_ms) WHERE state != 2;"
    "CREATE TABLE iter_blocks ("
    "  iter INTEGER NOT NULL, block INTEGER NOT NULL, lane INTEGER NOT NULL,"
    "  state INTEGER NOT NULL, rank INTEGER, token INTEGER, deadline_ms INTEGER,"
    "  PRIMARY KEY (iter, block)) WITHOUT ROWID;"
    "CREATE INDEX iter_blocks_pending ON iter_blocks(iter, lane, block) WHERE state = 0;"
    "CREATE INDEX iter_blocks_leased ON iter_blocks(deadline_ms) WHERE state = 1;"
    "CREATE INDEX iter_blocks_by_rank ON iter_blocks(iter, rank) WHERE state = 1;"
    "CREATE TABLE iter_lanes ("
    "  iter INTEGER NOT NULL, lane INTEGER NOT NULL, next INTEGER NOT NULL,"
    "  PRIMARY KEY (iter, lane)) WITHOUT ROWID;",
    /* DistCompute compatibility (compat.c): a client's token and its worker,
     * and the job number given to a pipeline's first-stage task. */
    "CREATE TABLE compat_workers ("
    "  token TEXT PRIMARY KEY, pipeline TEXT NOT NULL, stage INTEGER NOT NULL,"
    "  worker INTEGER NOT NULL, created_ms INTEGER NOT NULL);"
    "CREATE TABLE compat_jobs ("
    "  pipeline TEXT NOT NULL, root INTEGER NOT NULL, number INTEGER NOT NULL,"
    "  PRIMARY KEY (pipeline, root));"
    "CREATE UNIQUE INDEX compat_jobs_number ON compat_jobs(pipeline, number);",
    /* Nodes (node.c); sessions with their counters and their results stream,
     * one row per index numbered by completion (session.c); broadcast updates
     * and the highest number per queue, kept apart so that numbers never
     * repeat after deletions (update.c). */
    "CREATE TABLE nodes ("
    "  name TEXT PRIMARY KEY, hostname TEXT, address TEXT, cpus INTEGER NOT NULL,"
    "  gpus TEXT, labels TEXT, state INTEGER NOT NULL, timeout_ms INTEGER NOT NULL,"
    "  last_seen_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL);"
    "CREATE INDEX nodes_active ON nodes(state, last_seen_ms);"
    "CREATE INDEX workers_by_node ON workers(node, state) WHERE node IS NOT NULL;"
    "CREATE TABLE sessions ("
    "  id TEXT PRIMARY KEY, queue TEXT NOT NULL, state INTEGER NOT NULL,"
    "  cleanup_on_exit INTEGER NOT NULL, timeout_ms INTEGER NOT NULL, init_data TEXT,"
    "  created_ms INTEGER NOT NULL, last_seen_ms INTEGER NOT NULL,"
    "  next_index INTEGER NOT NULL DEFAULT 0, last_seq INTEGER NOT NULL DEFAULT 0,"
    "  total INTEGER NOT NULL DEFAULT 0, done INTEGER NOT NULL DEFAULT 0,"
    "  failed INTEGER NOT NULL DEFAULT 0, closed_why TEXT);"
    "CREATE INDEX sessions_open ON sessions(state, last_seen_ms);"
    "CREATE TABLE session_results ("
    "  session TEXT NOT NULL, seq INTEGER NOT NULL, idx INTEGER NOT NULL,"
    "  task INTEGER NOT NULL, state INTEGER NOT NULL,"
    "  PRIMARY KEY (session, seq)) WITHOUT ROWID;"
    "CREATE UNIQUE INDEX session_results_idx ON session_results(session, idx);"
    "CREATE INDEX tasks_by_session ON tasks(session, queue, idx) WHERE session IS NOT NULL;"
    "CREATE TABLE updates ("
    "  queue TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT NOT NULL, session TEXT,"
    "  created_ms INTEGER NOT NULL, PRIMARY KEY (queue, seq)) WITHOUT ROWID;"
    "CREATE INDEX updates_by_session ON updates(session) WHERE session IS NOT NULL;"
    "CREATE TABLE update_seqs (queue TEXT PRIMARY KEY, last INTEGER NOT NULL);",
    /* Shared data (shared.c): a blob's newest level and ttl; its kept levels
     * with the file holding each; files of deleted levels until the sweep
     * unlinks them; what a task requires (JSON text). */
    "CREATE TABLE shared_blobs ("
    "  scope TEXT NOT NULL, name TEXT NOT NULL, level INTEGER NOT NULL,"
    "  ttl_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL,"
    "  updated_ms INTEGER NOT NULL, PRIMARY KEY (scope, name)) WITHOUT ROWID;"
    "CREATE INDEX shared_blobs_expiry ON shared_blobs(expires_ms);"
    "CREATE TABLE shared_levels ("
    "  scope TEXT NOT NULL, name TEXT NOT NULL, level INTEGER NOT NULL, size INTEGER NOT NULL,"
    "  checksum TEXT NOT NULL, file TEXT NOT NULL, created_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (scope, name, level)) WITHOUT ROWID;"
    "CREATE INDEX shared_levels_file ON shared_levels(file);"
    "CREATE TABLE shared_trash (file TEXT PRIMARY KEY) WITHOUT ROWID;"
    "ALTER TABLE tasks ADD COLUMN requires TEXT;",
    /* The node cache's counters, as its agent last reported them (JSON). */
    "ALTER TABLE nodes ADD COLUMN cache TEXT;",
    /* Tasks per queue and state, kept by the writers (counts.c), instead of
     * tasks_by_state: that index was rewritten at every state change only so
     * that counting and listing by state could use it.  tasks_by_queue is
     * written only when a task comes or goes; tasks_failed only when one
     * enters or leaves failed, dead or cancelled (docs/design-notes.md). */
    "CREATE TABLE queue_counts ("
    "  queue TEXT NOT NULL, state INTEGER NOT NULL, n INTEGER NOT NULL,"
    "  PRIMARY KEY (queue, state)) WITHOUT ROWID;"
    "INSERT INTO queue_counts(queue, state, n)"
    "  SELECT queue, state, count(*) FROM tasks GROUP BY queue, state;"
    "DROP INDEX tasks_by_state;"
    "CREATE INDEX tasks_by_queue ON tasks(queue, id);"
    "CREATE INDEX tasks_failed ON tasks(queue, id) WHERE state >= 3;",
    /* No tasks_by_worker: it was written twice in every task's cycle (lease
     * and its end) only so that a worker's leases could be found by index.
     * Leased tasks are few (a batch per worker), so those lookups scan
     * tasks_leased, which now carries the worker: the scan reads the index
     * alone, never the rows.  tasks_leased is written at the same moments
     * as before, the worker being set and cleared with the state
     * (docs/design-notes.md, "Indexes after tasks_by_worker"). */
    "DROP INDEX tasks_by_worker;"
    "DROP INDEX tasks_leased;"
    "CREATE INDEX tasks_leased ON tasks(deadline_ms, worker) WHERE state = 1;",
    /* A session's init_data in a table of its own: the session row is
     * written at every heartbeat, results read and recorded result, and
     * with a large init_data in it SQLite went through every overflow page
     * of it each time (design-notes "Sessions").  The column stays, NULL. */
    "CREATE TABLE session_data (session TEXT PRIMARY KEY, init_data TEXT NOT NULL);"
    "INSERT INTO session_data(session, init_data)"
    "  SELECT id, init_data FROM sessions WHERE init_data IS NOT NULL;"
    "UPDATE sessions SET init_data = NULL WHERE init_data IS NOT NULL;",
    /* The agent process that registered a node (node.c: a second agent under
     * a name a live one holds is refused); NULL for agents that send none. */
    "ALTER TABLE nodes ADD COLUMN instance TEXT;",
    /* The blocks and tokens of the acknowledgement that completed an
     * iteration's last epoch (iter_lease.c): that epoch's block rows are
     * deleted with it, and these alone answer a retry of that acknowledgement
     * as a repeat.  At most one request's blocks (1000) per iteration. */
    "CREATE TABLE iter_final_acks ("
    "  iter INTEGER NOT NULL, block INTEGER NOT NULL, token INTEGER NOT NULL,"
    "  epoch INTEGER NOT NULL, PRIMARY KEY (iter, block)) WITHOUT ROWID;",
    /* What the sweep keeps of an expired shared blob, so that a read or an
     * update of it still says that it expired (shared.c): its ttl and when it
     * expired.  Gone when the name is written or deleted, after
     * SHARED_EXPIRED_KEEP_MS, and beyond the newest SHARED_EXPIRED_MAX rows. */
    "CREATE TABLE shared_expired ("
    "  scope TEXT NOT NULL, name TEXT NOT NULL, ttl_ms INTEGER NOT NULL,"
    "  expired_ms INTEGER NOT NULL, PRIMARY KEY (scope, name)) WITHOUT ROWID;"
    "CREATE INDEX shared_expired_by_time ON shared_expired(expired_ms);",
    /* How a task's last lease to end by other than a completion ended
     * (lease_internal.h, lease_end_t): its token, and the kind of end times
     * 8 plus the state it left the task in.  Kept when the task is leased
     * again, so that a fail or release retried under that token (its reply
     * was lost) is answered as a repeat, also after a restart.  NULL for
     * rows whose lease never ended since this migration. */
    "ALTER TABLE tasks ADD COLUMN ended_token INTEGER;"
    "ALTER TABLE tasks ADD COLUMN ended_as INTEGER;",
    /* The registering process's id, when it sent one (worker.c): a
     * registration sent again after its reply was lost finds its worker
     * instead of making a second one. */
    "ALTER TABLE workers ADD COLUMN instance TEXT;"
    "CREATE INDEX workers_by_instance ON workers(instance) WHERE instance IS NOT NULL;",
    /* Iteration blocks keyed by epoch as well (iter.c): when an epoch
     * completes its rows stay where they are, each done block with the token
     * that acknowledged it, until the next epoch completes, so that a retry
     * of any acknowledgement of it (its reply was lost) is answered as a
     * repeat.  State 3 marks the blocks of the one acknowledgement that
     * completed it.  This replaces iter_final_acks, whose rows (the final
     * acknowledgement of each iteration's last epoch) become rows of state 3;
     * the rows of a current epoch take its number. */
    "CREATE TABLE iter_blocks_v15 ("
    "  iter INTEGER NOT NULL, epoch INTEGER NOT NULL, block INTEGER NOT NULL,"
    "  lane INTEGER NOT NULL, state INTEGER NOT NULL, rank INTEGER, token INTEGER,"
    "  deadline_ms INTEGER, PRIMARY KEY (iter, epoch, block)) WITHOUT ROWID;"
    "INSERT INTO iter_blocks_v15(iter, epoch, block, lane, state, rank, token, deadline_ms)"
    "  SELECT b.iter, i.epoch, b.block, b.lane, b.state, b.rank, b.token, b.deadline_ms"
    "  FROM iter_blocks b JOIN iterations i ON i.id = b.iter;"
    "INSERT INTO iter_blocks_v15(iter, epoch, block, lane, state, rank, token, deadline_ms)"
    "  SELECT f.iter, f.epoch, f.block, 0, 3, NULL, f.token, NULL"
    "  FROM iter_final_acks f JOIN iterations i ON i.id = f.iter AND f.epoch = i.epoch - 1;"
    "DROP TABLE iter_blocks;"
    "DROP TABLE iter_final_acks;"
    "ALTER TABLE iter_blocks_v15 RENAME TO iter_blocks;"
    "CREATE INDEX iter_blocks_pending ON iter_blocks(iter, lane, block) WHERE state = 0;"
    "CREATE INDEX iter_blocks_leased ON iter_blocks(deadline_ms) WHERE state = 1;"
    "CREATE INDEX iter_blocks_by_rank ON iter_blocks(iter, rank) WHERE state = 1;",
    /* Retention of done tasks (queue_reap.c): how long a queue keeps a done
     * task after its completion (NULL: for ever) and how many it removed so
     * far.  The removal finds them through tasks_by_queue, which exists
     * already: no index is written on the task's path for it.  And the
     * queues being deleted: a queue with many tasks leaves `queues` at once,
     * its tasks are deleted in chunks by the head's background work, and its
     * counts stay exact until the last chunk drops them with this row. */
    "ALTER TABLE queues ADD COLUMN keep_done_ms INTEGER;"
    "ALTER TABLE queues ADD COLUMN reaped INTEGER NOT NULL DEFAULT 0;"
    "CREATE TABLE queue_trash ("
    "  name TEXT PRIMARY KEY, tasks INTEGER NOT NULL, deleted_ms INTEGER NOT NULL) WITHOUT ROWID;",
    /* Job numbers (compat_jobs.c): a row per numbered task instead of one per
     * job root, so that a row can go with its task, and one counter per
     * pipeline, so that numbers are never given twice once rows go.  Keyed
     * by the pipeline's first queue, as the Python client names a pipeline;
     * the tracker's rows were keyed by the --distcompute name, which SQL
     * cannot map to its queue: they keep it behind "distcompute:" (no queue
     * name has a colon) until the head adopts them at start-up.  Rows of jobs
     * of which no task is left (neither the root nor a child of it) are not
     * carried over.  A deleted queue's trash row keeps its `next`, which tells
     * whether a done task's number is still wanted by a next stage. */
    "CREATE TABLE compat_numbers ("
    "  task INTEGER NOT NULL, pipeline TEXT NOT NULL, number INTEGER NOT NULL,"
    "  PRIMARY KEY (task, pipeline)) WITHOUT ROWID;"
    "CREATE TABLE compat_counters ("
    "  pipeline TEXT PRIMARY KEY, last INTEGER NOT NULL) WITHOUT ROWID;"
    "INSERT INTO compat_counters(pipeline, last)"
    "  SELECT 'distcompute:' || pipeline, max(number) FROM compat_jobs GROUP BY pipeline;"
    "INSERT INTO compat_numbers(task, pipeline, number)"
    "  SELECT root, 'distcompute:' || pipeline, number FROM compat_jobs"
    "  WHERE root IN (SELECT id FROM tasks)"
    "     OR root IN (SELECT parent FROM tasks WHERE parent IS NOT NULL);"
    "DROP TABLE compat_jobs;"
    "ALTER TABLE queue_trash ADD COLUMN next TEXT;",
    /* Sessions closed with more tasks than one chunk (session_close.c): the
     * close is answered at once and this row, committed with it, stands for
     * the tasks it left: those carrying the session with ids up to `horizon`
     * (the highest id at the close), which no lease, ready count or task
     * read sees from then on, and which the head's background work deletes
     * a chunk at a time with the session's results; `deleted` counts them.
     * The row goes with the last chunk; a restart resumes from it. */
    "CREATE TABLE session_trash ("
    "  session TEXT PRIMARY KEY, horizon INTEGER NOT NULL, closed_ms INTEGER NOT NULL,"
    "  deleted INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;",
    /* A close now takes the tasks it leaves in session_trash out of their
     * queues' counts at once, and the background deletion moves no counts
     * (session_close.c): those of the sessions closed before do that here. */
    "UPDATE queue_counts SET n = n - (SELECT count(*) FROM session_trash AS c"
    "  JOIN tasks AS t INDEXED BY tasks_by_session ON t.session = c.session"
    "  AND t.queue = queue_counts.queue WHERE t.id <= c.horizon AND t.state = queue_counts.state)"
    "  WHERE EXISTS (SELECT 1 FROM session_trash);",
    /* The key of a worker's last lease request that leased something, when
     * the request carried one, and the first and last fencing tokens that
     * request drew (lease_retry.c): the same request sent again after its
     * reply was lost is answered with those of its leases the worker still
     * holds, instead of new ones.  NULL for workers that sent no key. */
    "ALTER TABLE workers ADD COLUMN lease_request TEXT;"
    "ALTER TABLE workers ADD COLUMN lease_first_token INTEGER;"
    "ALTER TABLE workers ADD COLUMN lease_last_token INTEGER;",
    /* Those records in a table of their own, one per worker and stream of
     * its keys, instead of one per worker (lease_retry.c): `muster worker
     * --concurrency N` leases under one worker id from N slots, each
     * numbering its keys in a stream of its own (the key without its
     * trailing "-DIGITS", '' for a key that does not end so:
     * lease_retry_stream_len, computed here in SQL), and each slot's keyed
     * lease replaced the record of the slot before, so only the slot that
     * leased last had its retry answered.  The records of active workers
     * move; those of gone workers answer nothing (a gone worker's requests
     * are refused) and go with the columns. */
    "CREATE TABLE lease_requests ("
    "  worker INTEGER NOT NULL, stream TEXT NOT NULL, request TEXT NOT NULL,"
    "  first_token INTEGER NOT NULL, last_token INTEGER NOT NULL,"
    "  PRIMARY KEY (worker, stream)) WITHOUT ROWID;"
    "INSERT INTO lease_requests(worker, stream, request, first_token, last_token)"
    "  SELECT id, CASE WHEN length(head) < length(lease_request) AND substr(head, -1) = '-'"
    "    THEN substr(head, 1, length(head) - 1) ELSE '' END,"
    "    lease_request, lease_first_token, lease_last_token"
    "  FROM (SELECT id, lease_request, lease_first_token, lease_last_token,"
    "    rtrim(lease_request, '0123456789') AS head FROM workers"
    "    WHERE state = 0 AND lease_request IS NOT NULL);"
    "ALTER TABLE workers DROP COLUMN lease_request;"
    "ALTER TABLE workers DROP COLUMN lease_first_token;"
    "ALTER TABLE workers DROP COLUMN lease_last_token;",
    /* The worker instances reported ended by DELETE
     * /v1/workers/instance/{instance} (worker_ended.c), crashed or by a
     * goodbye: a registration with one of them that reaches the head after
     * the report (it was on its way when its process died) makes no worker.
     * Rows go WORKER_ENDED_KEEP_MS after the report (the reaper) and beyond
     * the newest WORKER_ENDED_MAX. */
    "CREATE TABLE ended_instances ("
    "  instance TEXT PRIMARY KEY, ended_ms INTEGER NOT NULL, crashed INTEGER NOT NULL)"
    "  WITHOUT ROWID;"
    "CREATE INDEX ended_instances_by_time ON ended_instances(ended_ms);",
    /* Sealed sessions (session.c): once its producer says no task will
     * follow (POST /v1/sessions/{id}/seal, or a put with "seal": true) a
     * session refuses puts, and a reader that has every result knows the
     * stream ended instead of waiting for tasks that may yet come.  Sessions
     * open before this migration are not sealed. */
    "ALTER TABLE sessions ADD COLUMN sealed INTEGER NOT NULL DEFAULT 0;",
    /* Why and when a worker went (worker.c, worker_gone_t): the list of
     * workers said only "gone", and an operator could not tell a goodbye
     * from a timeout or a crash.  Written once, with the state, so no index
     * and nothing on the path of a task.  Workers gone before this
     * migration get 'unknown' and no time: nobody kept either. */
    "ALTER TABLE workers ADD COLUMN gone_reason TEXT;"
    "ALTER TABLE workers ADD COLUMN gone_at_ms INTEGER;"
    "UPDATE workers SET gone_reason = 'unknown' WHERE state = 1;",
    /* A queue's failed and dead tasks by when they got there (task.c,
     * task_list_recent_text): the dashboard shows the newest of them with
     * their errors, and tasks_failed, by id, leaves a task that was
     * requeued and died again among the oldest.  Written only when a task
     * enters or leaves failed or dead (updated_ms does not change in
     * between), as tasks_failed is; cancelled tasks, which a session close
     * makes by the thousand, stay out. */
    "CREATE INDEX tasks_ended ON tasks(queue, state, updated_ms) WHERE state IN (3, 4);",
    /* Bounds on anonymous DistCompute clients (compat_bounds.c): a
     * pipeline's active workers are counted at every api/new, each active
     * worker looked up by its id in compat_workers; the gone workers that
     * did nothing are found by when they went, to be deleted an hour
     * later.  Neither is written on the path of a task: a worker enters
     * the second when it goes, and its counters do not move after. */
    "CREATE INDEX compat_workers_by_worker ON compat_workers(worker);"
    "CREATE INDEX workers_idle_gone ON workers(gone_at_ms)"
    "  WHERE state = 1 AND completed = 0 AND failed = 0 AND flagged = 0;",
};

const int store_migration_count = (int)(sizeof store_migrations / sizeof store_migrations[0]);
