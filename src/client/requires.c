/*
 * requires.c — the shared data that tasks require (muster_shared_level_t,
 * docs/api.md "Tasks that require shared data").
 *
 * muster_put_requiring, muster_session_put_requiring and a pool that
 * requires levels all check the levels here before anything is sent, in the
 * head's words (its limit, its name rule), and write them as the one
 * "requires" array that every task of the request carries.
 */
#include "client/client_internal.h"
#include "core/names.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* requires_problem for element `i` alone, and against the elements before
 * it: a task requires one level of each blob (a worker names the file of
 * blob NAME MUSTER_SHARED_NAME, which two levels could not share). */
static muster_err_t requires_element_problem(const muster_shared_level_t *levels, size_t i,
                                             char *why, size_t size) {
  const muster_shared_level_t *l = &levels[i];
  if (l->scope == NULL || l->name == NULL) {
    snprintf(why, size, "requires[%zu]: scope, name and level are all required", i);
    return MUSTER_INVALID;
  }
  if (l->level < 1) {
    snprintf(why, size, "requires[%zu].level: %lld, expected 1 or more", i, (long long)l->level);
    return MUSTER_INVALID;
  }
  const char *bad = !name_is_valid(l->scope) ? "scope" : !name_is_valid(l->name) ? "name" : NULL;
  if (bad != NULL) {
    const char *given = bad[0] == 's' ? l->scope : l->name;
    snprintf(why, size, "requires[%zu].%s '%.140s': %s", i, bad, given, name_rule_text(given));
    return MUSTER_NAME_INVALID;
  }
  for (size_t j = 0; j < i; j++)
    if (strcmp(levels[j].scope, l->scope) == 0 && strcmp(levels[j].name, l->name) == 0) {
      snprintf(why, size,
               "requires[%zu]: %s/%s is required already (requires[%zu]): a task requires one "
               "level of each blob",
               i, l->scope, l->name, j);
      return MUSTER_INVALID;
    }
  return MUSTER_OK;
}

muster_err_t requires_problem(const muster_shared_level_t *levels, size_t n, char *why,
                              size_t size) {
  if (n > MUSTER_MAX_REQUIRES) {
    snprintf(why, size, "requires: %zu levels, at most %d allowed", n, MUSTER_MAX_REQUIRES);
    return MUSTER_INVALID;
  }
  if (levels == NULL && n > 0) {
    snprintf(why, size, "requires: %zu levels, but the array is NULL", n);
    return MUSTER_INVALID;
  }
  muster_err_t err = MUSTER_OK;
  for (size_t i = 0; err == MUSTER_OK && i < n; i++)
    err = requires_element_problem(levels, i, why, size);
  return err;
}

muster_err_t requires_check(muster_client_t *client, const muster_shared_level_t *levels,
                            size_t n) {
  char why[CLIENT_MESSAGE_MAX];
  muster_err_t err = requires_problem(levels, n, why, sizeof why);
  return err == MUSTER_OK ? MUSTER_OK : client_fail(client, err, "%s", why);
}

json_t *requires_tree(const muster_shared_level_t *levels, size_t n) {
  json_t *list = json_array();
  for (size_t i = 0; list != NULL && i < n; i++) {
    json_t *one = json_pack("{s:s, s:s, s:I}", "scope", levels[i].scope, "name", levels[i].name,
                            "level", (json_int_t)levels[i].level);
    if (one == NULL || json_array_append_new(list, one) != 0) {
      json_decref(list);
      list = NULL;
    }
  }
  return list;
}

muster_shared_level_t *requires_copy(const muster_shared_level_t *levels, size_t n) {
  muster_shared_level_t *copy = calloc(n ? n : 1, sizeof *copy);
  for (size_t i = 0; copy != NULL && i < n; i++) {
    copy[i].level = levels[i].level;
    copy[i].scope = strdup(levels[i].scope);
    copy[i].name = strdup(levels[i].name);
    if (copy[i].scope == NULL || copy[i].name == NULL) {
      requires_free(copy, i + 1);
      copy = NULL;
    }
  }
  return copy;
}

void requires_free(muster_shared_level_t *levels, size_t n) {
  for (size_t i = 0; levels != NULL && i < n; i++) {
    free((char *)levels[i].scope);
    free((char *)levels[i].name);
  }
  free(levels);
}
