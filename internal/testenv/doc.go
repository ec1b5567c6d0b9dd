// Package testenv gives tests real Redis and PostgreSQL servers and a
// fault-injecting TCP proxy.
//
// # Shared and private servers
//
// The machine normally runs a shared Redis at 127.0.0.1:6379 and a shared
// PostgreSQL at 127.0.0.1:5432 (users root and postgres, database test, trust
// authentication). [Redis] and [Postgres] hand out isolated views of those
// shared servers: a unique key prefix whose keys are deleted at cleanup, and a
// fresh schema that is dropped at cleanup. Tests that only read and write use
// these.
//
// Tests that stop, restart, flush or pause a server must never touch the shared
// one: they use [PrivateRedis] and [PrivatePostgres], which start a server of
// the test's own on a free port and stop it at cleanup.
//
// If a shared server is not reachable (for example on a fresh machine that only
// has the binaries installed), [Redis] and [Postgres] transparently fall back to
// a private server that is started lazily, once per test binary, and shared by
// all tests of that binary. Packages should use [Main] in TestMain so that such
// servers are stopped when the tests finish:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// Without Main the fallback servers are still killed when the test binary
// exits (they get a parent-death signal), but their temporary directories are
// left behind in /tmp.
//
// # Environment variables
//
//   - HEARTH_TEST_REDIS_ADDR (host:port) replaces 127.0.0.1:6379 as the shared
//     Redis address.
//   - HEARTH_TEST_PG_ADDR (host:port) replaces 127.0.0.1:5432 as the shared
//     PostgreSQL address.
//   - HEARTH_ALLOW_SKIP: a test that needs a server and cannot get one fails;
//     with HEARTH_ALLOW_SKIP=1 it is skipped instead (see [RequireServer]).
//   - CI: when it is "true", such a test fails even with HEARTH_ALLOW_SKIP=1.
//
// Pointing the two address variables at a closed port, for example
// 127.0.0.1:1, exercises the fallback path.
//
// # Binaries
//
// Private Redis servers run /usr/bin/redis-server (any redis-server on PATH).
// Private PostgreSQL servers use the newest /usr/lib/postgresql/<version>/bin
// (or initdb and postgres on PATH). PostgreSQL refuses to run as root, so when
// the tests run as root the server binaries are run as user postgres through
// runuser, in a directory under /tmp owned by that user.
//
// # Cluster and Sentinel
//
// [RedisCluster] starts 3 masters and 3 replicas (redis-server
// --cluster-enabled, joined with redis-cli --cluster create) with a 1 s
// cluster-node-timeout, and offers kill -9 of a master with the wait for its
// replica's promotion, restart of a node, a reshard with redis-cli and the
// slot owners. [RedisSentinel] starts 1 master, 1 replica and 3 sentinels
// (redis-server --sentinel, no redis-sentinel package needed), with SENTINEL
// FAILOVER and kill -9 of the master. Both need redis-cli and are stopped at
// cleanup; a failure to start fails the test (skips with HEARTH_ALLOW_SKIP=1).
//
// # Faults
//
// [NewProxy] puts a Toxiproxy proxy (used as a library, in process) in front
// of any TCP address; the test can then add latency (both ways, or on the
// replies only), limit the bandwidth, reset connections, cut connections or
// black hole traffic, and restore it.
//
// All functions that take a testing.TB must be called from the test's own
// goroutine, because they may call t.Fatalf or t.Skipf.
package testenv
