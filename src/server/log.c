/*
 * log.c — timestamps and log lines.  Also hosts fail_set, the other tiny
 * formatting helper every server module uses.
 */
#include "log.h"
#include "fail.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static log_level_t log_threshold = LOG_INFO;
static const char *const log_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

void log_set_level(log_level_t level) {
  log_threshold = level;
}

int log_level_parse(const char *name) {
  static const char *const lower[] = {"debug", "info", "warn", "error"};
  for (int i = 0; i < 4; i++)
    if (strcmp(name, lower[i]) == 0)
      return i;
  return -1;
}

int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void log_msg(log_level_t level, const char *fmt, ...) {
  if (level < log_threshold)
    return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s.%03ldZ %-5s %s\n", stamp, ts.tv_nsec / 1000000, log_names[level], line);
}

muster_err_t fail_set(fail_t *f, muster_err_t code, const char *fmt, ...) {
  f->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->message, sizeof f->message, fmt, ap);
  va_end(ap);
  return code;
}

const char *fail_message(const fail_t *f) {
  return f->message[0] ? f->message : muster_strerror(f->code);
}
