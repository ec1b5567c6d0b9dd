package store

import (
	"embed"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The scripts are the files of lua/, embedded. A script that reads Hearth's
// own keys is composed at init, in this order, from:
//
//  1. constants: one `local NAME = value` line per number the Go side owns
//     (MaxEpochAhead, FoundMax, LeaseTTLFactor, RenewTolerance), so that each
//     is written once, in Go;
//  2. lib_prelude.lua: epoch validation (hearth_epoch, hearth_epoch_ok, ...);
//  3. the libraries the script needs (lib_fence.lua, lib_version.lua,
//     lib_raise.lua), each a set of local functions;
//  4. the script's own file, which calls them.
//
// Composition rather than one file per script keeps each helper written
// once: five scripts share the fence check and three the version check,
// and the epoch validation must be the same in all of them (a check that
// differs between two scripts is how a planted value slips through one).
// The scripts that touch no epoch (renew, release, the roll-up claim, the
// pre-warm's plain fenced SET) are their file alone.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// constants is part 1 above.
var constants = fmt.Sprintf(`local HEARTH_AHEAD_MS = %d
local HEARTH_FOUND_MAX = %d
local HEARTH_LEASE_TTL_FACTOR = %d
local HEARTH_RENEW_TOLERANCE_MS = %d
`, MaxEpochAhead.Milliseconds(), FoundMax, LeaseTTLFactor, RenewTolerance)

func lua(name string) string {
	b, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		panic(fmt.Sprintf("store: embedded script %s: %v", name, err))
	}
	return string(b)
}

// compose is constants + lib_prelude.lua + the named files, in order.
func compose(files ...string) string {
	var b strings.Builder
	b.WriteString(constants)
	b.WriteString(lua("lib_prelude.lua"))
	for _, f := range files {
		b.WriteString(lua(f))
	}
	return b.String()
}

// sources is every script's text, by its last file, for the tests.
var sources = map[string]string{}

func stateScript(files ...string) *redis.Script {
	src := compose(files...)
	sources[files[len(files)-1]] = src
	return redis.NewScript(src)
}

func plainScript(file string) *redis.Script {
	src := lua(file)
	sources[file] = src
	return redis.NewScript(src)
}

// The lease (leader/lease.go).
var (
	// Acquire takes the lease under a new epoch (lua/acquire.lua).
	Acquire = stateScript("acquire.lua")
	// Renew extends the lease only if it still holds the term's value.
	Renew = plainScript("renew.lua")
	// Release deletes the lease only if it still holds the term's value.
	Release = plainScript("release.lua")
)

// The fenced writes (fence/fence.go, fence/version.go): each checks the
// writer's epoch against the fence key in the value's hash slot, raises it,
// and writes; each is idempotent, so a retransmitted pipeline does no harm.
var (
	// Set: KEYS value, fence; ARGV epoch, value, ttl ms. 1 written, 0 fenced.
	Set = stateScript("lib_fence.lua", "set.lua")
	// SetMany: KEYS fence, values; one fence check for a chunk of SETs.
	SetMany = stateScript("lib_fence.lua", "set_many.lua")
	// Extend: KEYS value, fence; PEXPIRE … GT behind the fence.
	Extend = stateScript("lib_fence.lua", "extend.lua")
	// VersionedSet: the fenced write through the key's version record.
	VersionedSet = stateScript("lib_fence.lua", "lib_version.lua", "versioned_set.lua")
	// VersionedSetMany: VersionedSet for many keys under one fence key.
	VersionedSetMany = stateScript("lib_fence.lua", "lib_version.lua", "versioned_set_many.lua")
	// Raise raises one fence key to a new leader's epoch.
	Raise = stateScript("lib_raise.lua", "raise.lua")
	// RepairRaise lowers a fence above the epoch counter (compare-and-set)
	// to the counter's value, then raises it as Raise does.
	RepairRaise = stateScript("lib_raise.lua", "repair_raise.lua")
)

// The pre-warm's writes (warmer/prewarmstore.go, fence/prewarm.go): they
// read the fence and never raise it.
var (
	// PrewarmSet: a fenced SET [NX] of `hearth prewarm`.
	PrewarmSet = plainScript("prewarm_set.lua")
	// PrewarmVersioned: the pre-warm's write through the version record.
	PrewarmVersioned = stateScript("lib_version.lua", "prewarm_versioned.lua")
	// Shorten: KEYS key; ARGV ms. Takes ms off the key's TTL, counted from
	// its own expiry (a copy's write that took longer than its TTL allowed for).
	Shorten = plainScript("shorten.lua")
)

// Marker checks the re-warm marker and writes it back when absent or
// foreign (rewarm/rewarm.go).
var Marker = stateScript("marker.lua")

// RollupClaim hands the access-log roller the next thing to roll up for one
// bucket (accesslog/rollup.go).
var RollupClaim = plainScript("rollup_claim.lua")
