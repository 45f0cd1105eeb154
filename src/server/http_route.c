/*
 * http_route.c — a request's path and query as the route layer reads them:
 * the route matched against the table (404 / 405 with its Allow header), the
 * `{}` segments decoded into the request's parameters, the query string split
 * and percent-decoded into its table.
 *
 * Everything runs on the event-loop thread, before the request's handler.
 */
#include "http.h"
#include "http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HTTP_MAX_SEGMENTS 8

int64_t http_param_id(const char *text) {
  if (text == NULL || *text < '1' || *text > '9')
    return 0;
  char *end;
  long long v = strtoll(text, &end, 10);
  return *end == '\0' && v > 0 && v < (1LL << 53) ? v : 0;
}

const char *http_query(http_req_t *r, const char *key) {
  for (size_t i = 0; i < r->query_count; i++)
    if (strcmp(r->query_key[i], key) == 0)
      return r->query_value[i];
  return NULL;
}

static int http_hex(char ch) {
  return ch >= '0' && ch <= '9'   ? ch - '0'
         : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
         : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                  : -1;
}

/* Percent-decodes `len` bytes of `in` into `out` (room for len + 1), and '+'
 * to a space when `plus`; returns the decoded length, or -1 when it would
 * hold a NUL.  A '%' without two hex digits stays as it is. */
static long http_decode(const char *in, size_t len, bool plus, char *out) {
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    int hi, lo;
    if (in[i] == '%' && i + 2 < len && (hi = http_hex(in[i + 1])) >= 0 &&
        (lo = http_hex(in[i + 2])) >= 0) {
      out[n] = (char)(hi * 16 + lo);
      i += 2;
    } else {
      out[n] = plus && in[i] == '+' ? ' ' : in[i];
    }
    if (out[n++] == '\0')
      return -1;
  }
  out[n] = '\0';
  return (long)n;
}

/* Splits and decodes the query string into r's table; false with a 400 reply
 * set when a parameter is not `key=value` or there are too many. */
bool http_parse_query(http_req_t *r, const char *query) {
  size_t len = strlen(query);
  if (len == 0)
    return true;
  r->query_text = malloc(len + 1);
  if (r->query_text == NULL) {
    http_fail(r, MUSTER_NOMEM, "out of memory");
    return false;
  }
  char *out = r->query_text;
  for (const char *p = query; *p;) {
    size_t n = strcspn(p, "&");
    const char *eq = memchr(p, '=', n);
    if (n == 0) { /* "a=1&&b=2": an empty parameter is skipped */
      p++;
      continue;
    }
    if (eq == NULL) {
      http_fail(r, MUSTER_BAD_REQUEST, "query parameter '%.*s' has no value; write key=value",
                (int)(n > 60 ? 60 : n), p);
      return false;
    }
    if (r->query_count == HTTP_MAX_QUERY) {
      http_fail(r, MUSTER_BAD_REQUEST, "more than %d query parameters", HTTP_MAX_QUERY);
      return false;
    }
    long klen = http_decode(p, (size_t)(eq - p), true, out);
    long vlen = klen < 0 ? -1 : http_decode(eq + 1, (size_t)(p + n - eq - 1), true, out + klen + 1);
    if (vlen < 0) {
      http_fail(r, MUSTER_BAD_REQUEST, "query parameter '%.*s' holds an encoded NUL",
                (int)(n > 60 ? 60 : n), p);
      return false;
    }
    r->query_key[r->query_count] = out;
    r->query_value[r->query_count++] = out + klen + 1;
    out += klen + 1 + vlen + 1;
    p += n + (p[n] == '&');
  }
  return true;
}

/* Splits `path` in place into segments at every '/'; returns their count or
 * -1.  Leading slashes are skipped, but every other empty segment is kept:
 * "/v1/queues/" names the queue "" and "/v1/shared//w" the scope "", so an
 * empty name is refused as a bad name rather than routed elsewhere (collapsed,
 * "/v1/shared//w" would list the scope "w" in answer to a download). */
static int http_split(char *path, char **segs) {
  while (*path == '/')
    path++;
  if (*path == '\0')
    return 0;
  int n = 0;
  for (char *seg = path; seg != NULL; n++) {
    if (n == HTTP_MAX_SEGMENTS)
      return -1;
    segs[n] = seg;
    seg = strchr(seg, '/');
    if (seg != NULL)
      *seg++ = '\0';
  }
  return n;
}

/* The pattern's next segment from *p (patterns have no empty segments):
 * its start, with its length in *len; NULL at the end. */
static const char *http_pattern_seg(const char **p, size_t *len) {
  while (**p == '/')
    (*p)++;
  if (**p == '\0')
    return NULL;
  const char *seg = *p;
  *len = strcspn(seg, "/");
  *p += *len;
  return seg;
}

static bool http_is_param(const char *seg, size_t len) {
  return len == 2 && seg[0] == '{' && seg[1] == '}';
}

/* True when the route's pattern matches `segs`; fills r->params.  It runs for
 * every route tried on every request, so it walks the pattern in place. */
static bool http_match(const char *pattern, char **segs, int nsegs, http_req_t *r) {
  const char *p = pattern, *seg;
  size_t len;
  int n = 0;
  while ((seg = http_pattern_seg(&p, &len)) != NULL) {
    if (n == nsegs)
      return false;
    if (!http_is_param(seg, len) && (strncmp(seg, segs[n], len) != 0 || segs[n][len] != '\0'))
      return false;
    n++;
  }
  if (n != nsegs)
    return false;
  p = pattern;
  for (int i = 0, np = 0; (seg = http_pattern_seg(&p, &len)) != NULL; i++) {
    if (!http_is_param(seg, len) || np == HTTP_MAX_PARAMS)
      continue;
    size_t slen = strlen(segs[i]);
    char *decoded = malloc(slen + 1);
    if (decoded && http_decode(segs[i], slen, false, decoded) < 0)
      /* An encoded NUL would cut the name short: keep the raw segment, which
       * no name rule accepts, so the handler refuses it. */
      memcpy(decoded, segs[i], slen + 1);
    r->params[np++] = decoded;
  }
  return true;
}

void http_clear_params(http_req_t *r) {
  for (int i = 0; i < HTTP_MAX_PARAMS; i++) {
    free(r->params[i]);
    r->params[i] = NULL;
  }
}

/* Appends `method` (and HEAD after GET, which every GET route answers) to
 * the comma-separated list `allow` unless it is there already. */
static void http_allow_add(char *allow, size_t size, const char *method) {
  const char *add[2] = {method, strcmp(method, "GET") == 0 ? "HEAD" : NULL};
  for (int i = 0; i < 2 && add[i]; i++) {
    bool seen = false;
    for (const char *p = allow; *p && !seen; p += strspn(p, ", ")) {
      size_t len = strcspn(p, ",");
      seen = len == strlen(add[i]) && strncmp(p, add[i], len) == 0;
      p += len;
    }
    size_t used = strlen(allow);
    if (!seen)
      snprintf(allow + used, size - used, "%s%s", used ? ", " : "", add[i]);
  }
}

/* Finds the route for the request; sets a 404/405 reply when there is none
 * (a 405 with the Allow header). */
const http_route_t *http_route(http_req_t *r, const char *path) {
  char copy[2048], *segs[HTTP_MAX_SEGMENTS];
  size_t len = strlen(path);
  if (len >= sizeof copy) {
    http_fail(r, MUSTER_NOT_FOUND, "no endpoint at this path");
    return NULL;
  }
  memcpy(copy, path, len + 1);
  int n = http_split(copy, segs);
  const char *method = h1_method(r->req);
  char allow[128] = "";
  for (const http_route_t *rt = http_routes; n >= 0 && rt->method; rt++) {
    if (!http_match(rt->pattern, segs, n, r))
      continue;
    if (strcmp(rt->method, method) == 0 ||
        (strcmp(rt->method, "GET") == 0 && strcmp(method, "HEAD") == 0))
      return rt;
    http_allow_add(allow, sizeof allow, rt->method);
    http_clear_params(r);
  }
  if (allow[0]) {
    /* RFC 9110, 15.5.6: a 405 must list the methods the path does take. */
    h1_add_header(r->req, "Allow", allow);
    http_fail(r, MUSTER_METHOD_NOT_ALLOWED, "%s is not allowed on this endpoint; it takes %s",
              method, allow);
  } else
    http_fail(r, MUSTER_NOT_FOUND, "no endpoint at %.200s; see docs/api.md", path);
  return NULL;
}
