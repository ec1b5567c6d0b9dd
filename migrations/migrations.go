// Package migrations holds Hearth's own SQL schema (the access log) as embedded
// goose migrations, and runs them with a version table of Hearth's own name so
// that they never collide with the application's migrations.
package migrations

import (
	"database/sql"
	"embed"
	"fmt"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the migrations, one goose SQL file per version.
//
//go:embed *.sql
var FS embed.FS

// VersionTable records which of Hearth's migrations ran. It is not goose's
// default table name, so an application that uses goose keeps its own history.
const VersionTable = "hearth_schema_version"

// lockID is the advisory lock Hearth's migrations hold, so that two
// `hearth migrate up` started at once run one after the other. It differs
// from goose's default, so an application's own goose runs are not blocked.
const lockID int64 = 0x6865617274680001 // "hearth" + 1

// NewProvider returns a goose provider for Hearth's migrations on db, a
// PostgreSQL database (through pgx's database/sql driver).
func NewProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID))
	if err != nil {
		return nil, fmt.Errorf("migrations: session locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS,
		goose.WithTableName(VersionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}
