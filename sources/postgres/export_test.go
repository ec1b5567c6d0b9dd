package postgres

import (
	"context"

	"github.com/hearth-dev/hearth/warmer"
)

// BoundedSQL returns the query Load runs for spec (the declaration's query wrapped
// with the value bound).
func (s *Source) BoundedSQL(ctx context.Context, spec *warmer.Spec) (string, error) {
	sh, err := s.shape(ctx, spec)
	if err != nil {
		return "", err
	}
	return sh.sql, nil
}

// Described is how many times the source has described a declaration's query.
func (s *Source) Described() int64 { return s.described.Load() }

// SizesSQL returns the query that reads the sizes of values that came back
// NULL from BoundedSQL's.
func (s *Source) SizesSQL(ctx context.Context, spec *warmer.Spec) (string, error) {
	sh, err := s.shape(ctx, spec)
	if err != nil {
		return "", err
	}
	return sh.sizes, nil
}
