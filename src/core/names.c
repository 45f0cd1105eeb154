/*
 * names.c — name validation shared by head, client and CLI.
 */
#include "core/names.h"

#include <string.h>

bool name_was_valid(const char *name) {
  if (name == NULL)
    return false;
  size_t len = strlen(name);
  if (len == 0 || len > NAME_MAX_LEN)
    return false;
  for (size_t i = 0; i < len; i++) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok)
      return false;
  }
  return true;
}

bool name_is_dots(const char *name) {
  return name != NULL && (strcmp(name, ".") == 0 || strcmp(name, "..") == 0);
}

bool name_is_valid(const char *name) {
  return name_was_valid(name) && !name_is_dots(name);
}

const char *name_rule_text(const char *name) {
  return name_is_dots(name) ? NAME_DOTS_TEXT : NAME_RULE_TEXT;
}
