package store

// What a write reports per entry: the checks of a version-checked write (the
// reasons are the ones the scripts' replies give, KeyReply.Why) and what a
// set-if-absent write did.

// Reasons of hearth_version_repairs_total: what a version-checked write found
// wrong at a key.
const (
	// RepairValueMismatch: the value was not the bytes its record says Hearth
	// wrote (another client's SET, an application's older value).
	RepairValueMismatch = "value_mismatch"
	// RepairValueAbsent: a record refused the write while the value it
	// guards was absent.
	RepairValueAbsent = "value_absent"
	// RepairRecordUnconfirmed: a record refused the write with a version the
	// origin, re-read after it, did not reach: foreign, replaced.
	RepairRecordUnconfirmed = "record_unconfirmed"
	// RepairRecordMalformed: the record was not one Hearth writes (format,
	// number range, Redis type, TTL, epoch): treated as absent, replaced.
	RepairRecordMalformed = "record_malformed"
)

// VersionCheck is what a version-checked write found wrong at one entry's
// key (warmer.CheckedStore); the zero value: nothing.
type VersionCheck struct {
	// Reason is one of the Repair… reasons, "" when nothing was wrong.
	Reason string
	// Found says what was wrong, for the log; never the value's bytes.
	Found string
	// Recheck: the write was refused as older by a version record that the
	// value in Redis does not back (absent, or other bytes). Record is that
	// record: the writer re-reads the origin once and writes the entry again
	// with Entry.Unconfirmed = Record.
	Recheck bool
	Record  string
}

// SetOutcome is what a store did with one entry of a write.
type SetOutcome uint8

const (
	// SetWritten: the value was written.
	SetWritten SetOutcome = iota
	// SetPresent: the key already held a value, which was left alone
	// (set-if-absent).
	SetPresent
	// SetFenced: the fence holds a newer epoch than the writer's: a leader
	// took over after the writer read the epoch; nothing was written.
	SetFenced
)
