// Package store owns Hearth's Redis protocol: the name of every key of
// Hearth's own (lease, epoch counter, release channel, fences, version
// records, re-warm markers, access-log buckets and their roll-up keys), every
// Lua script Hearth runs (embedded from lua/*.lua), the formats those keys
// hold (epochs, lease values, version records), and the counter and log of
// the foreign values found in them and repaired; and the warmer's writes
// themselves: the Entry it writes and RedisStore, the unfenced store of a
// Hearth without leader election (SET … PX, PEXPIRE … GT, PTTL).
//
// The leader package keeps the lease mechanism and its policy (when to
// campaign, renew, step down), the warmer keeps what it writes and when; both
// speak to Redis about Hearth's own keys only through the names and scripts
// here. A test (onegrep_test.go) fails when a production file outside this
// package spells one of these names or carries a Lua script.
package store
