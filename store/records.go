package store

import (
	"crypto/sha1"
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"
)

// ParseEpoch parses an epoch as the scripts store it: decimal digits in
// their canonical form (no sign, exponent, nan, inf, no leading zero), at
// most 16 of them (lib_prelude.lua's hearth_canonical).
func ParseEpoch(s string) (int64, bool) {
	if s == "" || len(s) > 16 || strings.Trim(s, "0123456789") != "" || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// leaseValue is what a lease holds: <epoch>:<instance id>/<attempt>.
var leaseValue = regexp.MustCompile(`^(0|[1-9][0-9]{0,15}):([^:/]+)/[0-9]+$`)

// ParseLease parses the value of LeaseKey as Acquire writes it,
// <epoch>:<instance id>/<attempt>: its epoch and the holder's instance id.
func ParseLease(s string) (epoch int64, id string, ok bool) {
	m := leaseValue.FindStringSubmatch(s)
	if m == nil {
		return 0, "", false
	}
	e, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, "", false
	}
	return e, m[2], true
}

// EncodeVersion maps an int64 origin version to the 20-digit decimal string
// the version scripts compare: order-preserving over the whole int64 range,
// negative versions included (the sign bit is flipped).
func EncodeVersion(v int64) string { return string(AppendVersion(nil, v)) }

// AppendVersion appends EncodeVersion(v) to dst.
func AppendVersion(dst []byte, v int64) []byte {
	u := uint64(v) ^ (1 << 63)
	var digits [20]byte
	for i := len(digits) - 1; i >= 0; i-- {
		digits[i] = byte('0' + u%10)
		u /= 10
	}
	return append(dst, digits[:]...)
}

// ValueHash is what a version record remembers of a value: its SHA-1 in
// lowercase hex, as the script's redis.sha1hex computes it, so that the script
// can tell whether the value in Redis is the one a record was written with.
func ValueHash(v []byte) string { return string(AppendValueHash(nil, v)) }

// AppendValueHash appends ValueHash(v) to dst.
func AppendValueHash(dst []byte, v []byte) []byte {
	h := sha1.Sum(v) // a content check, not a security boundary
	return hex.AppendEncode(dst, h[:])
}

// ParseVersionRecord parses a version record as the script writes it, for
// tests and tools that watch versions from outside: the origin version it
// holds (ok false when it has none or the record is not one).
func ParseVersionRecord(s string) (version int64, ok bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 || len(parts[2]) != 20 {
		return 0, false
	}
	u, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return 0, false
	}
	return int64(u ^ (1 << 63)), true
}

// recordFormat is a version record as lib_version.lua writes it (a 40-digit
// SHA-1: the 32-digit records of earlier releases prove no value).
var recordFormat = regexp.MustCompile(`^([0-9]{1,16}):([0-9]{1,16}):([0-9]{20})?:([0-9a-f]{40})$`)

// ParseCopiedRecord decodes a version record read from a Redis (a blue-green
// copy's source, untrusted): the origin version it holds (versioned false when
// it holds none) and the SHA-1 of the value it was written with; ok is false
// for anything Hearth does not write, a version above the encoding's range
// included.
func ParseCopiedRecord(rec string) (version int64, versioned bool, hash string, ok bool) {
	m := recordFormat.FindStringSubmatch(rec)
	if m == nil {
		return 0, false, "", false
	}
	if m[3] == "" {
		return 0, false, m[4], true
	}
	u, err := strconv.ParseUint(m[3], 10, 64)
	if err != nil {
		return 0, false, "", false
	}
	return int64(u ^ (1 << 63)), true, m[4], true
}
