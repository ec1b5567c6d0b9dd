package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/hearth-dev/hearth/warmer"
)

// Plan check thresholds: a sequential scan is flagged on a relation of at
// least DefaultExplainMinRows rows (pg_class.reltuples), or, when the table
// was never analysed, at least explainMinPages pages on disk.
const (
	DefaultExplainMinRows = 10_000
	explainMinPages       = 1000 // 8 MB with the default 8 kB block size
	explainMaxSample      = 1000
)

// PlanFinding is a problem in the plan of a declaration's query: a
// sequential scan of a relation big enough for it to matter.
type PlanFinding struct {
	// Declaration is the declaration's name, Field its query's config path.
	Declaration string `json:"declaration"`
	Field       string `json:"field"`
	// Relation is the scanned relation, schema-qualified.
	Relation string `json:"relation"`
	// Rows and Pages are the relation's size as the catalog knows it
	// (reltuples, -1 when never analysed; pages on disk).
	Rows  int64 `json:"rows"`
	Pages int64 `json:"pages"`
	// Filter is the scan's filter as EXPLAIN prints it, if any.
	Filter string `json:"filter,omitempty"`
	// Advice says what to change.
	Advice string `json:"advice"`
}

func (f PlanFinding) String() string {
	s := fmt.Sprintf("%s: Seq Scan on %s (%s rows, %d pages)", f.Field, f.Relation, rowsText(f.Rows), f.Pages)
	if f.Filter != "" {
		s += " filter " + f.Filter
	}
	return s + ": " + f.Advice
}

func rowsText(n int64) string {
	if n < 0 {
		return "never analysed"
	}
	return strconv.FormatInt(n, 10)
}

// ExplainSample is the batch of members a family's query is explained
// with: the declared members, up to one batch; without any, the numbers 1…n.
// The sample is bound exactly as loads bind members: one text[] as $1.
func ExplainSample(spec *warmer.Spec) []string {
	n := min(max(spec.BatchSize, 1), explainMaxSample)
	if len(spec.Members) > 0 {
		return spec.Members[:min(n, len(spec.Members))]
	}
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(i + 1)
	}
	return out
}

// planNode is the part of EXPLAIN (FORMAT JSON) the check reads.
type planNode struct {
	NodeType string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Schema   string     `json:"Schema"`
	Filter   string     `json:"Filter"`
	Plans    []planNode `json:"Plans"`
}

// Explain runs EXPLAIN (FORMAT JSON, VERBOSE) of the declaration's query (a
// family's with sample as $1, bound as loads bind it; nothing runs, EXPLAIN
// without ANALYZE only plans) and returns a finding for every sequential scan
// of a relation with at least minRows rows (0: DefaultExplainMinRows).
func (s *Source) Explain(ctx context.Context, spec *warmer.Spec, sample []string, minRows int64) ([]PlanFinding, error) {
	if minRows <= 0 {
		minRows = DefaultExplainMinRows
	}
	field := "keys[" + spec.Name + "].query"
	inner := strings.TrimRight(strings.TrimSpace(spec.Query), ";")
	// The query on its own lines, as the loads wrap it: a trailing comment
	// cannot swallow anything.
	sql := "EXPLAIN (FORMAT JSON, VERBOSE)\n" + inner + "\n"
	var args []any
	if spec.Template.IsFamily() {
		args = []any{sample}
	}
	var raw []byte
	if err := s.pool.QueryRow(ctx, sql, args...).Scan(&raw); err != nil {
		return nil, fmt.Errorf("%s: explain: %w", field, classify(err))
	}
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plans); err != nil {
		return nil, fmt.Errorf("%s: explain: unreadable plan: %w", field, err)
	}
	var scans []planNode
	var walk func(n planNode)
	walk = func(n planNode) {
		if n.NodeType == "Seq Scan" && n.Relation != "" {
			scans = append(scans, n)
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	for _, p := range plans {
		walk(p.Plan)
	}
	var out []PlanFinding
	for _, n := range scans {
		var rows, pages int64
		// Identifiers are bound as values, never spliced.
		err := s.pool.QueryRow(ctx, `SELECT c.reltuples::int8, pg_relation_size(c.oid) / current_setting('block_size')::int8
			FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
			WHERE c.relname = $1 AND ($2 = '' OR ns.nspname = $2)
			ORDER BY ns.nspname = ANY(current_schemas(false)) DESC LIMIT 1`, n.Relation, n.Schema).Scan(&rows, &pages)
		if err != nil {
			return nil, fmt.Errorf("%s: size of %s: %w", field, n.Relation, classify(err))
		}
		if rows < minRows && !(rows < 0 && pages >= explainMinPages) {
			continue
		}
		rel := n.Relation
		if n.Schema != "" {
			rel = n.Schema + "." + n.Relation
		}
		out = append(out, PlanFinding{Declaration: spec.Name, Field: field, Relation: rel, Rows: rows, Pages: pages,
			Filter: n.Filter, Advice: advice(spec, n.Filter)})
	}
	return out, nil
}

// advice names the likely cause: a cast on the column (which defeats its
// index), or no usable index.
func advice(spec *warmer.Spec, filter string) string {
	if !spec.Template.IsFamily() {
		return "the query reads the whole table on every refresh: add an index on the filtered column(s) or narrow the query"
	}
	if strings.Contains(filter, ")::text") || strings.Contains(filter, ")::character varying") {
		return "the cast on the column defeats its index: bind a typed array instead, e.g. WHERE id = ANY($1::bigint[]) (members arrive as text[])"
	}
	return "no index is used for the members: index the member column and compare it to a typed array, e.g. WHERE id = ANY($1::bigint[])"
}
