package store

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// spellings are the pieces of Hearth's own key names (and of the read
// side's, which the daemon must take from readside) that only this package
// may write in a string literal, and the marks of a Lua script.
var spellings = []struct {
	what string
	re   *regexp.Regexp
}{
	{"the lease key (LeaseKey, EpochKey)", regexp.MustCompile(`\{lease\}`)},
	{"the release channel (ReleaseChannel)", regexp.MustCompile(`lease:released`)},
	{"a fence key (FenceKey, SlotFenceKey, Fences)", regexp.MustCompile(`:fence($|[:{])`)},
	{"a version record (VersionKey)", regexp.MustCompile(`:ver:`)},
	{"the re-warm marker (MarkerKey, ClusterMarkerKey)", regexp.MustCompile(`:warm($|[:{])`)},
	{"an access-log bucket (AccessBucketKey)", regexp.MustCompile(`:access:`)},
	{"a roll-up key (RollupKey, RollupTokenKey)", regexp.MustCompile(`:rollup:|^:token$`)},
	{"a read-side key (readside.LockKey, StaleKey, DeltaKey)", regexp.MustCompile(`:rs:`)},
	{"a Lua script (store's lua/*.lua)", regexp.MustCompile(`redis\.p?call\(|KEYS\[\d|ARGV\[\d`)},
}

// spelled lists the string literals of one Go file that spell a Hearth key or
// carry a Lua script, and the calls of redis.NewScript, as "line: why".
func spelled(fset *token.FileSet, f *ast.File) []string {
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BasicLit:
			if n.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(n.Value)
			if err != nil {
				return true
			}
			for _, sp := range spellings {
				if sp.re.MatchString(s) {
					out = append(out, fset.Position(n.Pos()).String()+": spells "+sp.what+" in "+n.Value)
				}
			}
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && x.Name == "redis" && n.Sel.Name == "NewScript" {
				out = append(out, fset.Position(n.Pos()).String()+": builds a script outside store (redis.NewScript)")
			}
		}
		return true
	})
	return out
}

// TestOneSpelling is the proof that store is the one home of Hearth's Redis
// protocol: no production file of the module outside store/ spells one of
// its key names or carries a script. readside/ is a module of its own (it
// cannot import store; store takes the access-bucket name from it), and test
// files may spell names, to check them from outside.
func TestOneSpelling(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	scanned := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch {
			case rel == "store", rel == "readside", strings.HasPrefix(d.Name(), "."), d.Name() == "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		scanned++
		for _, s := range spelled(fset, f) {
			t.Error(s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scanned < 100 {
		t.Fatalf("scanned %d production files under %s: the walk missed the module", scanned, root)
	}
	t.Logf("%d production files outside store/ and readside/ spell no Hearth key and carry no script", scanned)
}

// The scan would catch what store replaced.
func TestOneSpellingCatches(t *testing.T) {
	src := "package p\n" +
		"var a = ns + \":{lease}\"\n" +
		"var b = ns + \":fence:{\" + tag + \"}\"\n" +
		"var c = ns + \":fence\"\n" +
		"var d = ns + \":warm\"\n" +
		"var e = ns + \":ver:{\"\n" +
		"var f = namespace + \":access:\"\n" +
		"var g = namespace + \":rollup:{\"\n" +
		"var h = ns + \":rs:lock:{\"\n" +
		"var i = redis.NewScript(`return redis.call('GET', KEYS[1])`)\n" +
		"var j = ns + \":lease:released\"\n" +
		"var ok = []string{\"hearth-rewarm-\", \":fenced\", \"warmer\", \"access\"}\n"
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := spelled(fset, f)
	lines := map[int]bool{}
	for _, s := range got {
		n, _ := strconv.Atoi(strings.Split(s, ":")[1])
		lines[n] = true
	}
	for n := 2; n <= 11; n++ {
		if !lines[n] {
			t.Errorf("line %d of the sample not caught: %q", n, strings.Split(src, "\n")[n-1])
		}
	}
	if lines[12] {
		t.Errorf("line 12 (no Hearth key) flagged: %q", got)
	}
}
