// Package fencetest tests package fence against real databases: a private PostgreSQL and
// MariaDB server and an SQLite file, started by the tests themselves, and a private
// redis-server for the cases with real dlock leases. It is a module of its own so that the
// database drivers stay out of the library's dependencies.
package fencetest
