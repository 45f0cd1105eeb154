/*
 * dashboard.c — serving the embedded page and its files, the throughput
 * series and the metrics text.
 *
 * Static files are answered from memory with a strict Content-Security-Policy
 * (scripts and styles from this origin only, no inline code, no framing), so
 * data shown by the page can never run as code even if it holds markup.
 */
#include "dashboard.h"
#include "compat.h"
#include "metrics.h"

#include <stdlib.h>
#include <string.h>

#define DASHBOARD_CSP                                                                              \
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "                \
  "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

const dashboard_asset_t *dashboard_asset(const char *name) {
  for (const dashboard_asset_t *a = dashboard_assets; name && a->name; a++)
    if (strcmp(a->name, name) == 0)
      return a;
  return NULL;
}

static const char *dashboard_type(const char *name) {
  static const struct {
    const char *ext, *type;
  } types[] = {{".html", "text/html; charset=utf-8"},
               {".js", "text/javascript; charset=utf-8"},
               {".css", "text/css; charset=utf-8"},
               {".svg", "image/svg+xml"}};
  size_t len = strlen(name);
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    size_t ext = strlen(types[i].ext);
    if (len > ext && strcmp(name + len - ext, types[i].ext) == 0)
      return types[i].type;
  }
  return "application/octet-stream";
}

/* Answers with the embedded file `name`, or a 404. */
static void dashboard_send(http_req_t *r, const char *name) {
  const dashboard_asset_t *a = dashboard_asset(name);
  if (a == NULL) {
    fail_t f;
    fail_set(&f, MUSTER_NOT_FOUND, "the dashboard has no file '%.100s'", name);
    http_reply_fail(r, &f);
    return;
  }
  h1_add_header(r->req, "Content-Security-Policy", DASHBOARD_CSP);
  h1_add_header(r->req, "X-Content-Type-Options", "nosniff");
  h1_add_header(r->req, "Referrer-Policy", "no-referrer");
  h1_add_header(r->req, "Cache-Control", "no-cache");
  http_reply_raw(r, 200, dashboard_type(a->name), a->data, a->len);
}

void dashboard_h_index(http_req_t *r) {
  dashboard_send(r, "index.html");
}

void dashboard_h_asset(http_req_t *r) {
  dashboard_send(r, r->params[0]);
}

/* Serves the page for a view of DistCompute pipeline params[0]. */
static void dashboard_compat_view(http_req_t *r, bool known_view, const char *view) {
  fail_t f;
  if (!compat_pipeline_exists(r->params[0])) {
    fail_set(&f, MUSTER_NOT_FOUND, "no DistCompute pipeline '%.100s' is exposed by this head",
             r->params[0]);
    http_reply_fail(r, &f);
  } else if (!known_view) {
    fail_set(&f, MUSTER_NOT_FOUND, "no page '%.100s'; try /, /leaderboard or /worker/STAGE/NAME",
             view);
    http_reply_fail(r, &f);
  } else {
    dashboard_send(r, "index.html");
  }
}

void dashboard_h_compat_page(http_req_t *r) {
  const char *view = r->params[1];
  dashboard_compat_view(r, view == NULL || view[0] == '\0' || strcmp(view, "leaderboard") == 0,
                        view);
}

void dashboard_h_compat_worker(http_req_t *r) {
  dashboard_compat_view(r, true, "worker");
}

void dashboard_h_throughput(http_req_t *r) {
  int64_t seconds;
  fail_t f;
  if (query_int_read(http_query(r, "seconds"), "seconds", 300, 1, METRICS_RING_SECONDS, &seconds,
                     &f)) {
    http_reply_fail(r, &f);
    return;
  }
  json_t *series = metrics_throughput(seconds);
  if (series == NULL) {
    fail_set(&f, MUSTER_NOMEM, "out of memory");
    http_reply_fail(r, &f);
    return;
  }
  http_reply_json(r, 200, series);
}

void dashboard_h_metrics(http_req_t *r) {
  fail_t f;
  http_role_t role = http_token_role(r);
  if (!r->head->cfg.metrics_public && role < HTTP_READ) {
    fail_set(&f, MUSTER_UNAUTHORIZED,
             "%s: send 'Authorization: Bearer TOKEN' with the read-only (--dashboard-token) or "
             "the admin token, or start the head with --metrics-public",
             http_token_sent(r) ? "the token sent is not valid for this head" : "no token sent");
    http_reply_fail(r, &f);
    return;
  }
  size_t len = 0;
  char *text = metrics_render(r->head, &len);
  if (text == NULL) {
    fail_set(&f, MUSTER_STORE, "the metrics could not be read from the store");
    http_reply_fail(r, &f);
    return;
  }
  http_reply_raw(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
  free(text);
}
