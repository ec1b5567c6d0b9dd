// Package testenv gives tests real Redis servers.
//
// # Shared and private servers
//
// The machine normally runs a shared Redis at 127.0.0.1:6379. [Redis] hands
// out an isolated view of it: a unique key prefix whose keys are deleted at
// cleanup. Tests that only read and write use it.
//
// Tests that stop, restart, flush or pause a server must never touch the shared
// one: they use [PrivateRedis], which starts a server of the test's own on a
// free port and stops it at cleanup.
//
// If the shared server is not reachable (for example on a fresh machine that
// only has the binaries installed), [Redis] transparently falls back to a
// private server that is started lazily, once per test binary, and shared by
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
//   - CI: when it is "true", a test that needs a server and cannot get one
//     fails instead of being skipped (see [RequireServer]).
//
// Pointing the address variable at a closed port, for example 127.0.0.1:1,
// exercises the fallback path.
//
// # Binaries
//
// Private Redis servers run /usr/bin/redis-server (any redis-server on PATH).
//
// All functions that take a testing.TB must be called from the test's own
// goroutine, because they may call t.Fatalf or t.Skipf.
package testenv
