package bench_test

import (
	"testing"

	"github.com/hearth-dev/hearth/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
