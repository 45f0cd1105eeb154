/*
 * store_schema.h — the store's migrations (store_schema.c), for store.c.
 */
#ifndef MUSTER_SERVER_STORE_SCHEMA_H
#define MUSTER_SERVER_STORE_SCHEMA_H

/* Migration N brings user_version from N to N + 1.  Never edit a released
 * one: add a new one at the end. */
extern const char *const store_migrations[];
extern const int store_migration_count;

#endif
