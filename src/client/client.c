/*
 * client.c — the libmuster handle and its HTTP transport.
 *
 * A handle to an http:// head talks through http1.c, libmuster's own HTTP/1.1
 * over one kept-alive connection (a fifth of libcurl's CPU per call); any other
 * URL (https://) goes through one libcurl easy handle, which also keeps its
 * connection alive between transfers.  Either way a handle that makes many
 * calls pays for one connect.  Requests are small JSON bodies sent at once:
 * Nagle is off (TCP_NODELAY) and "Expect: 100-continue" is suppressed, since
 * waiting a round trip before sending a few hundred bytes only adds latency.  The library never
 * prints and never aborts; every failure becomes a muster_err_t plus a message kept on the handle.
 */
#include "client/client_internal.h"
#include "client/jdump.h"
#include "client/jparse.h"
#include "core/url.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define CLIENT_DEFAULT_TIMEOUT_MS 60000L

static pthread_once_t client_global_once = PTHREAD_ONCE_INIT;
static CURLcode client_global_rc = CURLE_FAILED_INIT;

/* curl_global_init is not thread-safe in every libcurl; run it exactly once. */
static void client_global_init(void) {
  client_global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- messages ----------------------------------------------------------- */

muster_err_t client_fail(muster_client_t *client, muster_err_t err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(client->message, sizeof client->message, fmt, ap);
  va_end(ap);
  return err;
}

void client_ok(muster_client_t *client) {
  client->message[0] = '\0';
}

const char *muster_client_message(const muster_client_t *client) {
  return client ? client->message : "";
}

int muster_client_status(const muster_client_t *client) {
  return client ? client->status : 0;
}

void muster_client_set_timeout(muster_client_t *client, long timeout_ms) {
  if (client)
    client->timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
}

void muster_free(void *ptr) {
  free(ptr);
}

/* ---- the reply buffer ----------------------------------------------------- */

bool client_grow(char **data, size_t *cap, size_t need) {
  if (need <= *cap)
    return true;
  size_t size = *cap ? *cap : 4096;
  while (size < need)
    size *= 2;
  char *grown = realloc(*data, size);
  if (grown == NULL)
    return false;
  *data = grown;
  *cap = size;
  return true;
}

bool client_buf_reserve(client_buf_t *b, size_t more) {
  return client_grow(&b->data, &b->cap, b->len + more + 1);
}

bool client_buf_append(client_buf_t *b, const char *data, size_t n) {
  if (!client_buf_reserve(b, n))
    return false;
  memcpy(b->data + b->len, data, n);
  b->len += n;
  b->data[b->len] = '\0';
  return true;
}

/* libcurl's write callback: appends to the handle's reply buffer.  Returning
 * less than asked makes libcurl fail the transfer with CURLE_WRITE_ERROR, which
 * client_send() reports as MUSTER_NOMEM. */
static size_t client_on_body(char *data, size_t size, size_t nmemb, void *userdata) {
  size_t n = size * nmemb;
  return client_buf_append(userdata, data, n) ? n : 0;
}

/* ---- what answers ------------------------------------------------------- */

/* True when the `len` bytes at `line` start with header name `name` and its colon. */
static bool client_header_is(const char *line, size_t len, const char *name, size_t name_len) {
  return len > name_len && line[name_len] == ':' && strncasecmp(line, name, name_len) == 0;
}

/* True when `value` (`len` bytes, blanks before it) starts with the product
 * token `product`, alone or with a version or more ("muster-head",
 * "muster-head/1 (linux)"), before the line end if there is one. */
static bool client_product_is(const char *value, size_t len, const char *product) {
  size_t n = strlen(product);
  while (len > 0 && (*value == ' ' || *value == '\t'))
    value++, len--;
  return len >= n && memcmp(value, product, n) == 0 &&
         (len == n || (value[n] != '\0' && strchr("/ \t\r\n", value[n]) != NULL));
}

unsigned client_header_said(const char *line, size_t len) {
  static const char via_node[] = "(muster node"; /* the agent's Via: "1.1 NAME (muster node)" */
  if (client_header_is(line, len, "Server", 6)) {
    if (client_product_is(line + 7, len - 7, "muster-head"))
      return CLIENT_SAID_HEAD;
    return client_product_is(line + 7, len - 7, "muster-node") ? CLIENT_SAID_NODE : 0;
  }
  if (client_header_is(line, len, "Via", 3) &&
      memmem(line + 4, len - 4, via_node, sizeof via_node - 1) != NULL)
    return CLIENT_SAID_VIA_NODE;
  return 0;
}

muster_server_t client_server_of(unsigned said) {
  if (said & (CLIENT_SAID_NODE | CLIENT_SAID_VIA_NODE))
    return MUSTER_SERVER_NODE;
  return said & CLIENT_SAID_HEAD ? MUSTER_SERVER_HEAD : MUSTER_SERVER_UNKNOWN;
}

muster_server_t muster_client_server(const muster_client_t *client) {
  return client ? client->server : MUSTER_SERVER_UNKNOWN;
}

/* libcurl's header callback: notes what the reply's lines say of its sender;
 * a status line starts a reply afresh (an interim 100 has its own). */
static size_t client_on_header(char *data, size_t size, size_t nmemb, void *userdata) {
  muster_client_t *client = userdata;
  size_t n = size * nmemb;
  if (n >= 5 && memcmp(data, "HTTP/", 5) == 0)
    client->curl_said = 0;
  else
    client->curl_said |= client_header_said(data, n);
  return n;
}

/* ---- handle --------------------------------------------------------------- */

/* The header lines of libcurl transfers (this handle's and shared.c's). */
static muster_err_t client_setup_headers(muster_client_t *client, const char *token) {
  struct curl_slist *h = NULL, *next;
  char auth[1024];
  const char *fixed[] = {"Content-Type: application/json", "Accept: application/json",
                         "Expect:", NULL};
  for (int i = 0; fixed[i] != NULL; i++) {
    if ((next = curl_slist_append(h, fixed[i])) == NULL)
      goto nomem;
    h = next;
  }
  if (token != NULL && token[0] != '\0') {
    if (snprintf(auth, sizeof auth, "Authorization: Bearer %s", token) >= (int)sizeof auth) {
      curl_slist_free_all(h);
      return client_fail(client, MUSTER_INVALID, "the token is too long");
    }
    if ((next = curl_slist_append(h, auth)) == NULL)
      goto nomem;
    h = next;
  }
  client->headers = h;
  return MUSTER_OK;
nomem:
  curl_slist_free_all(h);
  return client_fail(client, MUSTER_NOMEM, "out of memory");
}

/* Sets the options that never change over the easy handle's life. */
static void client_setup_curl(muster_client_t *client) {
  CURL *curl = client->curl;
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, client->headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, client->curl_error);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, client_on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &client->reply);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, client_on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, client);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "libmuster/" MUSTER_VERSION);
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
}

/* A token goes into a header line: refuse characters that would end it. */
static int client_token_ok(const char *token) {
  return token == NULL || strpbrk(token, "\r\n") == NULL;
}

/* Why `url`, `token` and `out` cannot make a handle, or NULL when they can;
 * the text goes into `why` (`size` bytes). */
static const char *client_new_problem(const char *url, const char *token, muster_client_t **out,
                                      char *why, size_t size) {
  /* The CLI's rule for a head's URL (core/url.c): anything else would only
   * fail at the first call, in libcurl's words ("Unsupported protocol"). */
  const char *problem;
  if (out == NULL)
    snprintf(why, size, "out: a place for the handle is required");
  else if (url == NULL || url[0] == '\0')
    snprintf(why, size, "url: required (http://HOST:PORT or https://HOST:PORT)");
  else if ((problem = url_head_problem(url)) != NULL)
    snprintf(why, size, "url '%.300s': expected http://HOST[:PORT] or https://HOST[:PORT]: %s", url,
             problem);
  else if (!client_token_ok(token))
    snprintf(why, size, "token: contains a line break");
  else
    return NULL;
  return why;
}

/* Makes the handle once the arguments are known good; on failure `why`
 * (`size` bytes) says what went wrong. */
static muster_err_t client_make(const char *url, const char *token, muster_client_t **out,
                                char *why, size_t size) {
  snprintf(why, size, "out of memory");
  pthread_once(&client_global_once, client_global_init);
  if (client_global_rc != CURLE_OK)
    return MUSTER_NOMEM;
  muster_client_t *client = calloc(1, sizeof *client);
  if (client == NULL)
    return MUSTER_NOMEM;
  client->timeout_ms = CLIENT_DEFAULT_TIMEOUT_MS;
  client->base_url = strdup(url);
  client->token = token ? strdup(token) : NULL;
  if (client->base_url == NULL || (token != NULL && client->token == NULL)) {
    muster_client_free(client);
    return MUSTER_NOMEM;
  }
  size_t n = strlen(client->base_url);
  while (n > 0 && client->base_url[n - 1] == '/')
    client->base_url[--n] = '\0';
  muster_err_t err = client_setup_headers(client, token);
  if (err == MUSTER_OK && (client->http1 = http1_new(client->base_url, token)) == NULL) {
    if ((client->curl = curl_easy_init()) == NULL)
      err = client_fail(client, MUSTER_NOMEM, "out of memory");
    else
      client_setup_curl(client);
  }
  if (err != MUSTER_OK) {
    snprintf(why, size, "%s", client->message);
    muster_client_free(client);
    return err;
  }
  *out = client;
  return MUSTER_OK;
}

muster_err_t muster_client_open(const char *url, const char *token, muster_client_t **out,
                                char **message) {
  char problem[CLIENT_MESSAGE_MAX];
  const char *why = client_new_problem(url, token, out, problem, sizeof problem);
  if (message)
    *message = NULL;
  if (out)
    *out = NULL;
  muster_err_t err = why ? MUSTER_INVALID : client_make(url, token, out, problem, sizeof problem);
  if (err != MUSTER_OK && message)
    *message = strdup(problem);
  return err;
}

muster_err_t muster_client_new(const char *url, const char *token, muster_client_t **out) {
  return muster_client_open(url, token, out, NULL);
}

void muster_client_free(muster_client_t *client) {
  if (client == NULL)
    return;
  http1_free(client->http1);
  if (client->curl)
    curl_easy_cleanup(client->curl);
  curl_slist_free_all(client->headers);
  free(client->base_url);
  free(client->token);
  free(client->reply.data);
  jtext_buf_free(&client->body);
  free(client);
}

/* ---- transport ------------------------------------------------------------ */

/* Points the easy handle at `method` with `body` (NULL: none).  POST and PUT
 * without a body still send an empty one, which the server reads as {}. */
static void client_set_method(CURL *curl, const char *method, const char *body) {
  int wants_body = body != NULL || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0;
  if (wants_body) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body ? body : "");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? strlen(body) : 0));
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, strcmp(method, "POST") ? method : NULL);
  } else {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, strcmp(method, "GET") ? method : NULL);
  }
}

/* Non-zero when the transfer on `curl` ran out of time before it connected. */
static int client_curl_connect_timed_out(CURL *curl, CURLcode rc) {
  curl_off_t connected_us = 0;
  return rc == CURLE_OPERATION_TIMEDOUT &&
         curl_easy_getinfo(curl, CURLINFO_CONNECT_TIME_T, &connected_us) == CURLE_OK &&
         connected_us == 0;
}

void client_curl_reword(muster_client_t *client, CURL *curl, CURLcode rc, const char *url) {
  int timed_out = client_curl_connect_timed_out(curl, rc);
  if (rc != CURLE_COULDNT_CONNECT && rc != CURLE_COULDNT_RESOLVE_HOST && !timed_out)
    return;
  char *host = NULL, *port = NULL;
  CURLU *parts = curl_url();
  if (parts && curl_url_set(parts, CURLUPART_URL, url, 0) == CURLUE_OK &&
      curl_url_get(parts, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
      curl_url_get(parts, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
    long os_errno = 0;
    curl_easy_getinfo(curl, CURLINFO_OS_ERRNO, &os_errno);
    if (rc == CURLE_COULDNT_RESOLVE_HOST)
      snprintf(client->curl_error, sizeof client->curl_error, "could not resolve host %.200s",
               host);
    else
      snprintf(client->curl_error, sizeof client->curl_error,
               "could not connect to %.200s port %s: %s", host, port,
               os_errno == ETIMEDOUT || timed_out ? "timed out"
               : os_errno                         ? strerror((int)os_errno)
                                                  : curl_easy_strerror(rc));
  }
  curl_free(host);
  curl_free(port);
  curl_url_cleanup(parts);
}

/*
 * Performs one request and leaves the reply body in client->reply and the
 * status in client->status.  Returns MUSTER_OK when a reply of any status
 * arrived, MUSTER_NETWORK when none did, MUSTER_NOMEM when it could not be
 * stored.  The status is judged by the caller.
 */
static muster_err_t client_send(muster_client_t *client, const char *method, const char *path,
                                const char *body, long extra_wait_ms) {
  long timeout =
      client->timeout_ms ? client->timeout_ms + (extra_wait_ms > 0 ? extra_wait_ms : 0) : 0;
  if (client->http1 != NULL)
    return http1_send(client, method, path, body, timeout);
  size_t url_len = strlen(client->base_url) + strlen(path) + 1;
  char *url = malloc(url_len);
  if (url == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  snprintf(url, url_len, "%s%s", client->base_url, path);
  client->status = 0;
  client->reply.len = 0;
  if (client->reply.data)
    client->reply.data[0] = '\0';
  client->curl_error[0] = '\0';
  CURL *curl = client->curl;
  curl_easy_setopt(curl, CURLOPT_URL, url);
  client_set_method(curl, method, body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout);
  CURLcode rc = curl_easy_perform(curl);
  client_curl_reword(client, curl, rc, url);
  free(url);
  if (rc == CURLE_WRITE_ERROR)
    return client_fail(client, MUSTER_NOMEM, "out of memory while reading the reply");
  if (rc != CURLE_OK)
    return client_fail(client, MUSTER_NETWORK, "%s %s%s: %s", method, client->base_url, path,
                       client->curl_error[0] ? client->curl_error : curl_easy_strerror(rc));
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  client->status = (int)status;
  client->server = client_server_of(client->curl_said);
  return MUSTER_OK;
}

/* The code for a non-2xx reply that carries no usable error envelope (a proxy's
 * error page, say): the generic code of that status.  409 has no generic code,
 * so it stays MUSTER_PROTOCOL rather than guessing lease_lost. */
static muster_err_t client_status_err(int status) {
  static const struct {
    int status;
    muster_err_t err;
  } by_status[] = {
      {400, MUSTER_BAD_REQUEST},        {401, MUSTER_UNAUTHORIZED},
      {403, MUSTER_FORBIDDEN},          {404, MUSTER_NOT_FOUND},
      {405, MUSTER_METHOD_NOT_ALLOWED}, {413, MUSTER_BODY_TOO_LARGE},
      {415, MUSTER_UNSUPPORTED_MEDIA},  {503, MUSTER_UNAVAILABLE},
  };
  for (size_t i = 0; i < sizeof by_status / sizeof by_status[0]; i++)
    if (by_status[i].status == status)
      return by_status[i].err;
  return status >= 500 ? MUSTER_INTERNAL : MUSTER_PROTOCOL;
}

/* Turns the non-2xx reply in client->reply to `method` `path` into a code
 * and a message.  A reply without muster's error envelope most likely comes
 * from another server (or a proxy) at the base URL, and the message says so. */
static muster_err_t client_reply_error(muster_client_t *client, const char *method,
                                       const char *path) {
  json_t *root = json_loadb(client->reply.data ? client->reply.data : "", client->reply.len,
                            JSON_ALLOW_NUL, NULL);
  json_t *error = json_object_get(root, "error");
  const char *code = json_string_value(json_object_get(error, "code"));
  const char *message = json_string_value(json_object_get(error, "message"));
  muster_err_t err = code ? muster_err_from_name(code) : MUSTER_PROTOCOL;
  if (err == MUSTER_PROTOCOL || err == MUSTER_OK)
    err = client_status_err(client->status);
  if (message != NULL)
    client_fail(client, err, "%s", message);
  else if (code != NULL)
    client_fail(client, err, "%s (HTTP %d)", code, client->status);
  else
    client_fail(client, err,
                "the server at %s answered HTTP %d to %s %s without a muster error body: "
                "it is likely not a muster head; check the URL and its path",
                client->base_url, client->status, method, path);
  json_decref(root);
  return err;
}

muster_err_t client_call_text(muster_client_t *client, const char *method, const char *path,
                              const char *body, long extra_wait_ms) {
  muster_err_t err = client_send(client, method, path, body, extra_wait_ms);
  if (err != MUSTER_OK)
    return err;
  if (client->status < 200 || client->status > 299)
    return client_reply_error(client, method, path);
  return MUSTER_OK;
}

muster_err_t client_reply_tree(muster_client_t *client, const char *method, const char *path,
                               json_t **reply) {
  json_error_t jerr;
  *reply = json_loadb(client->reply.data ? client->reply.data : "", client->reply.len,
                      JSON_ALLOW_NUL, &jerr);
  if (*reply == NULL)
    return client_fail(client, MUSTER_PROTOCOL, "%s %s: unreadable reply: %s", method, path,
                       jerr.text);
  return MUSTER_OK;
}

muster_err_t client_reply_check(muster_client_t *client, const char *method, const char *path) {
  const char *text = client->reply.data, *end;
  size_t len = client->reply.len;
  jtext_info_t info;
  /* json_loadb without JSON_DECODE_ANY wants an object or an array. */
  if (len > 0 && (text[0] == '{' || text[0] == '[') &&
      (end = jtext_scan(text, text + len, &info)) != NULL && info.canonical &&
      jtext_only_space(end, text + len)) {
    client_ok(client);
    return MUSTER_OK;
  }
  json_t *reply = NULL;
  muster_err_t err = client_reply_tree(client, method, path, &reply);
  json_decref(reply);
  if (err == MUSTER_OK)
    client_ok(client);
  return err;
}

muster_err_t client_call(muster_client_t *client, const char *method, const char *path,
                         json_t *body, long extra_wait_ms, json_t **reply) {
  if (reply)
    *reply = NULL;
  char *text = NULL;
  if (body != NULL && (text = jdump(body, JSON_COMPACT | JSON_ENCODE_ANY)) == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory while encoding the request");
  muster_err_t err = client_call_text(client, method, path, text, extra_wait_ms);
  free(text);
  if (err == MUSTER_OK && reply != NULL)
    err = client_reply_tree(client, method, path, reply);
  if (err == MUSTER_OK)
    client_ok(client);
  return err;
}

muster_err_t muster_request(muster_client_t *client, const char *method, const char *path,
                            const char *body, char **reply) {
  if (reply)
    *reply = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  if (method == NULL || path == NULL || path[0] != '/')
    return client_fail(client, MUSTER_INVALID, "method and a path starting with '/' are needed");
  muster_err_t err = client_send(client, method, path, body, 0);
  if (err != MUSTER_OK)
    return err;
  if (client->status < 200 || client->status > 299)
    return client_reply_error(client, method, path);
  if (reply != NULL) {
    *reply = strdup(client->reply.data ? client->reply.data : "");
    if (*reply == NULL)
      return client_fail(client, MUSTER_NOMEM, "out of memory");
  }
  client_ok(client);
  return MUSTER_OK;
}

muster_err_t muster_health(muster_client_t *client) {
  if (client == NULL)
    return MUSTER_INVALID;
  json_t *reply = NULL;
  muster_err_t err = client_call(client, "GET", "/v1/health", NULL, 0, &reply);
  if (err != MUSTER_OK)
    return err;
  const char *status = json_string_value(json_object_get(reply, "status"));
  if (status == NULL)
    err = client_fail(client, MUSTER_PROTOCOL, "health reply has no status");
  else if (strcmp(status, "ok") != 0)
    err = client_fail(client, MUSTER_UNAVAILABLE, "the server reports status '%s'", status);
  json_decref(reply);
  return err;
}

/* ---- helpers shared by the call files -------------------------------------- */

/* Appends `s` to out[*at..size) percent-encoded as a path segment. */
static int client_path_escape(char *out, size_t size, size_t *at, const char *s) {
  static const char hex[] = "0123456789ABCDEF";
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    int plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
                *p == '-' || *p == '_' || *p == '.' || *p == '~';
    size_t need = plain ? 1 : 3;
    if (*at + need >= size)
      return -1;
    if (plain) {
      out[(*at)++] = (char)*p;
    } else {
      out[(*at)++] = '%';
      out[(*at)++] = hex[*p >> 4];
      out[(*at)++] = hex[*p & 15];
    }
  }
  return 0;
}

const char *client_min_problem(char *why, size_t size, const char *what, int64_t value, int64_t min,
                               const char *accepted) {
  if (value >= min)
    return NULL;
  snprintf(why, size, "%s: %lld, expected %s", what, (long long)value, accepted);
  return why;
}

muster_err_t client_check_min(muster_client_t *client, const char *what, int64_t value, int64_t min,
                              const char *accepted) {
  char why[CLIENT_MESSAGE_MAX];
  if (client_min_problem(why, sizeof why, what, value, min, accepted) == NULL)
    return MUSTER_OK;
  return client_fail(client, MUSTER_INVALID, "%s", why);
}

muster_err_t client_path(muster_client_t *client, char *out, size_t size, const char *fmt, ...) {
  va_list ap;
  size_t at = 0;
  int bad = 0;
  va_start(ap, fmt);
  for (const char *f = fmt; *f && !bad; f++) {
    if (strncmp(f, "%s", 2) == 0) {
      bad = client_path_escape(out, size, &at, va_arg(ap, const char *));
      f += 1;
    } else if (strncmp(f, "%lld", 4) == 0) {
      int n = snprintf(out + at, size - at, "%lld", va_arg(ap, long long));
      bad = n < 0 || at + (size_t)n >= size;
      at += bad ? 0 : (size_t)n;
      f += 3;
    } else if (at + 1 < size) {
      out[at++] = *f;
    } else {
      bad = 1;
    }
  }
  va_end(ap);
  out[bad ? 0 : at] = '\0';
  if (bad)
    return client_fail(client, MUSTER_NAME_INVALID, "a name in the request path is too long");
  return MUSTER_OK;
}

json_t *client_parse_value(muster_client_t *client, const char *text, const char *what) {
  char why[JPARSE_WHY];
  json_t *value = jparse(text, strlen(text), why, sizeof why);
  if (value == NULL)
    client_fail(client, MUSTER_INVALID, "%s: not valid JSON: %s", what, why);
  return value;
}

muster_err_t client_add_json(muster_client_t *client, jtext_buf_t *b, const char *text,
                             const char *array, size_t i, const char *field) {
  if (jtext_add_json(b, text, strlen(text)))
    return MUSTER_OK;
  char what[64];
  snprintf(what, sizeof what, "%s[%zu].%s", array, i, field);
  json_t *value = client_parse_value(client, text, what);
  if (value == NULL)
    return MUSTER_INVALID;
  char *dumped = client_dump_value(value);
  json_decref(value);
  if (dumped == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  jtext_add(b, dumped, strlen(dumped));
  free(dumped);
  return MUSTER_OK;
}

bool client_scan_text(const char **pp, const char *end, const char *name, size_t len) {
  if ((size_t)(end - *pp) < len || memcmp(*pp, name, len) != 0)
    return false;
  *pp += len;
  return true;
}

char *client_dump_value(const json_t *value) {
  return jdump(value, JSON_COMPACT | JSON_ENCODE_ANY);
}

int client_get_int(const json_t *obj, const char *key, int64_t fallback, int64_t *out) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL || json_is_null(v)) {
    *out = fallback;
    return 0;
  }
  if (!json_is_integer(v))
    return -1;
  *out = (int64_t)json_integer_value(v);
  return 0;
}
