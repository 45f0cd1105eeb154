/*
 * log.c — timestamps and log lines.  Also hosts fail_set, the other tiny
 * formatting helper every server module uses.
 */
#include "log.h"
#include "core/utf8.h"
#include "fail.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static log_level_t log_threshold = LOG_INFO;
static const char *const log_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

void log_set_level(log_level_t level) {
  log_threshold = level;
}

const char *const log_level_words[] = {"debug", "info", "warn", "error", NULL};

int log_level_parse(const char *name) {
  for (int i = 0; log_level_words[i]; i++)
    if (strcmp(name, log_level_words[i]) == 0)
      return i;
  return -1;
}

int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void log_format_time(int64_t ms, char out[32]) {
  time_t secs = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char day[24];
  strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, 32, "%s.%03dZ", day, (int)(ms % 1000));
}

void log_msg(log_level_t level, const char *fmt, ...) {
  if (level < log_threshold)
    return;
  char stamp[32];
  log_format_time(now_ms(), stamp);
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s %-5s %s\n", stamp, log_names[level], line);
}

muster_err_t fail_set(fail_t *f, muster_err_t code, const char *fmt, ...) {
  f->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->message, sizeof f->message, fmt, ap);
  va_end(ap);
  utf8_scrub(f->message); /* it may quote a client's bytes; the envelope is JSON */
  return code;
}

const char *fail_message(const fail_t *f) {
  return f->message[0] ? f->message : muster_strerror(f->code);
}

const char *fail_range(char *buf, size_t size, int64_t value, int64_t min, int64_t max) {
  if (max < FAIL_NO_UPPER)
    snprintf(buf, size, "from %lld to %lld", (long long)min, (long long)max);
  else if (value >= max) /* refused at max: it overflowed and was clamped */
    snprintf(buf, size, "at most %lld", (long long)max);
  else
    snprintf(buf, size, "at least %lld", (long long)min);
  return buf;
}

muster_err_t query_int_read(const char *text, const char *key, int64_t dflt, int64_t min,
                            int64_t max, int64_t *out, fail_t *f) {
  *out = dflt;
  if (text == NULL)
    return MUSTER_OK;
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (*text == '\0' || *end != '\0' || errno != 0 || v < min || v > max)
    return fail_query_int(f, key, text, min, max);
  *out = v;
  return MUSTER_OK;
}

muster_err_t fail_query_int(fail_t *f, const char *key, const char *text, int64_t min,
                            int64_t max) {
  char *end = NULL, range[64];
  long long v = strtoll(text, &end, 10);
  bool number = *text != '\0' && *end == '\0'; /* ERANGE: clamped, out of range */
  return fail_set(f, MUSTER_INVALID, "query %s: '%.40s' is %s; it must be %s", key, text,
                  number ? "out of range" : "not an integer",
                  fail_range(range, sizeof range, number ? v : min, min, max));
}
