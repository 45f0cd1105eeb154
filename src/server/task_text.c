/*
 * task_text.c — a task as the JSON object replies carry (docs/api.md, Task),
 * written as text from its row, and pages of such objects.
 *
 * The payload, the result and `requires` are stored as JSON text; they go
 * into the object as they stand (jv_add_stored), never parsed into a jansson
 * tree only to be written out again.  A page of 1000 tasks of 10 kB payloads
 * was 1000 json_loads, trees several times the size of their text, and a
 * walk of them at send time (docs/design-notes.md, "Stored JSON text spliced
 * into replies").  The bytes are those jw_dump wrote for the tree built before,
 * key for key in its order (tests/unit/test_task_text.c compares the two),
 * but for rows no head writes: a string column that is not UTF-8, or stored
 * text that is neither JSON nor UTF-8, goes out as null, where the tree could
 * not be built and the task was left out of its page.
 */
#include "task_internal.h"
#include "jv.h"
#include "reply_budget.h"
#include "task.h"

#include <string.h>

/* How a key's value is written from the row. */
typedef enum {
  FIELD_INT,         /* an integer column */
  FIELD_INT_OR_NULL, /* an integer column that may be NULL */
  FIELD_STRING,      /* a text column as a JSON string, or null */
  FIELD_STATE,       /* the state column by its name */
  FIELD_STORED,      /* stored JSON text, left out of a brief object */
  FIELD_LEASE,       /* {"worker", "deadline_ms"} while leased, else null */
  FIELD_REQUIRES,    /* stored JSON text, the key only when it is set */
} task_field_kind_t;

typedef struct {
  const char *key; /* `,"name":` */
  size_t key_len;
  int col;
  task_field_kind_t kind;
} task_field_t;

#define TASK_FIELD(name, col, kind)                                                                \
  { ",\"" name "\":", sizeof(",\"" name "\":") - 1, col, kind }

/* The keys after "id", in the order the tree had them. */
static const task_field_t task_fields[] = {
    TASK_FIELD("queue", 1, FIELD_STRING),       TASK_FIELD("state", 2, FIELD_STATE),
    TASK_FIELD("priority", 3, FIELD_INT),       TASK_FIELD("payload", 5, FIELD_STORED),
    TASK_FIELD("result", 6, FIELD_STORED),      TASK_FIELD("error", 7, FIELD_STRING),
    TASK_FIELD("attempts", 8, FIELD_INT),       TASK_FIELD("flags", 9, FIELD_INT),
    TASK_FIELD("key", 10, FIELD_STRING),        TASK_FIELD("session", 11, FIELD_STRING),
    TASK_FIELD("index", 12, FIELD_INT_OR_NULL), TASK_FIELD("parent", 13, FIELD_INT_OR_NULL),
    TASK_FIELD("run_at_ms", 4, FIELD_INT),      TASK_FIELD("created_ms", 14, FIELD_INT),
    TASK_FIELD("updated_ms", 15, FIELD_INT),    TASK_FIELD("lease", 16, FIELD_LEASE),
    TASK_FIELD("requires", 18, FIELD_REQUIRES),
};

#define TASK_DEADLINE_COLUMN 17

/* Appends text column `col` as a JSON string (up to a NUL, as json_string
 * read it), null when it is NULL or not UTF-8. */
static void task_add_string(jw_buf_t *out, sqlite3_stmt *s, int col) {
  const char *text = (const char *)sqlite3_column_text(s, col);
  size_t at = out->len;
  if (text)
    jw_add_string(out, text, strlen(text));
  if (text == NULL || (!out->failed && !jw_valid(out->buf + at, out->len - at))) {
    out->len = at;
    JW_ADD_LITERAL(out, "null");
  }
}

static void task_add_int_or_null(jw_buf_t *out, sqlite3_stmt *s, int col) {
  if (sqlite3_column_type(s, col) == SQLITE_NULL)
    JW_ADD_LITERAL(out, "null");
  else
    jw_add_int(out, sqlite3_column_int64(s, col));
}

/* The lease of a leased task: its worker (column `col`) and deadline. */
static void task_add_lease(jw_buf_t *out, sqlite3_stmt *s, int col) {
  if (sqlite3_column_int(s, 2) != TASK_LEASED) {
    JW_ADD_LITERAL(out, "null");
    return;
  }
  JW_ADD_LITERAL(out, "{\"worker\":");
  task_add_int_or_null(out, s, col);
  JW_ADD_LITERAL(out, ",\"deadline_ms\":");
  jw_add_int(out, sqlite3_column_int64(s, TASK_DEADLINE_COLUMN));
  JW_ADD_LITERAL(out, "}");
}

static void task_add_stored(jw_buf_t *out, sqlite3_stmt *s, int col) {
  const char *text = (const char *)sqlite3_column_text(s, col); /* before its length */
  jv_add_stored(out, text, text ? (size_t)sqlite3_column_bytes(s, col) : 0);
}

/* Appends field `f` of the row, key and value; nothing for a key the object
 * leaves out. */
static void task_add_field(jw_buf_t *out, sqlite3_stmt *s, const task_field_t *f, bool brief) {
  if ((f->kind == FIELD_STORED && brief) ||
      (f->kind == FIELD_REQUIRES && sqlite3_column_type(s, f->col) == SQLITE_NULL))
    return;
  jw_add_text(out, f->key, f->key_len);
  const char *state;
  switch (f->kind) {
  case FIELD_INT:
    jw_add_int(out, sqlite3_column_int64(s, f->col));
    break;
  case FIELD_INT_OR_NULL:
    task_add_int_or_null(out, s, f->col);
    break;
  case FIELD_STRING:
    task_add_string(out, s, f->col);
    break;
  case FIELD_STATE:
    state = task_state_name(sqlite3_column_int(s, f->col));
    jw_add_string(out, state, strlen(state));
    break;
  case FIELD_STORED:
  case FIELD_REQUIRES:
    task_add_stored(out, s, f->col);
    break;
  case FIELD_LEASE:
    task_add_lease(out, s, f->col);
    break;
  }
}

void task_write(jw_buf_t *out, sqlite3_stmt *s, bool brief) {
  JW_ADD_LITERAL(out, "{\"id\":");
  jw_add_int(out, sqlite3_column_int64(s, 0));
  for (size_t i = 0; i < sizeof task_fields / sizeof task_fields[0]; i++)
    task_add_field(out, s, &task_fields[i], brief);
  JW_ADD_LITERAL(out, "}");
}

/* ---- pages ----
 *
 * A page is written into the caller's buffer whole, the reply's text as it
 * goes out: a listing hands it to the reply as it is (http_reply_text),
 * without the copies a raw node in a tree costs (one into the node, one
 * more when jw_dump writes the tree). */

/* The bytes of the stored payload and result of a row of TASK_COLUMNS, what
 * its task object carries of them (reply_budget.h); none for a `brief` one. */
static size_t task_row_bytes(sqlite3_stmt *s, bool brief) {
  if (brief)
    return 0;
  return (size_t)sqlite3_column_bytes(s, 5) + (size_t)sqlite3_column_bytes(s, 6);
}

void task_page_start(task_page_text_t *page, jw_buf_t *out) {
  *page = (task_page_text_t){.out = out};
  JW_ADD_LITERAL(out, "{\"tasks\":[");
}

bool task_page_add(task_page_text_t *page, sqlite3_stmt *s, bool brief, bool left) {
  size_t size = left ? 0 : task_row_bytes(s, brief);
  if (!reply_budget_fits(page->count, page->bytes, size))
    return false;
  if (left)
    return true;
  if (page->count++)
    JW_ADD_LITERAL(page->out, ",");
  page->bytes += size;
  task_write(page->out, s, brief);
  return true;
}

muster_err_t task_page_end(task_page_text_t *page, bool more, int64_t next, fail_t *f) {
  JW_ADD_LITERAL(page->out, "],\"next\":");
  if (more)
    jw_add_int(page->out, next);
  else
    JW_ADD_LITERAL(page->out, "null");
  JW_ADD_LITERAL(page->out, "}");
  return page->out->failed ? fail_set(f, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}
