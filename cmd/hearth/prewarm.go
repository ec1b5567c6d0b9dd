package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/daemon"
	"github.com/hearth-dev/hearth/prewarm"
)

func newPrewarmCmd(g *globals) *cobra.Command {
	var (
		redisURL    string
		top         int
		minCoverage float64
		timeout     time.Duration
		overwrite   bool
		ranking     string
		fromURL     string
		fromOnly    bool
	)
	cmd := &cobra.Command{
		Use:   "prewarm",
		Short: "Warm a Redis once: declared single keys plus the top-N keys of the access log",
		Long: `Prewarm loads every declared single key and the top-N keys of the access log
(prewarm.top_n over prewarm.window) into a Redis, by the same code path the
daemon pre-warms with at start-up: each logged key is matched to its declaration
and validated (unknown or invalid keys are skipped and counted, never loaded),
loads are batched per declaration and bounded by prewarm.concurrency and
prewarm.rate. Use it before a blue-green cutover, against the green Redis.

By default it fills only absent keys (SET ... NX PX): a value already in Redis,
perhaps fresher than the one loaded, is left alone and counted as present.
--overwrite replaces present values. When a Hearth leader's state (lease, epoch
counter, fence) is in that Redis, every write is fenced by the newest epoch
issued there: if a leader takes over during the run, its fence refuses the
pre-warm's later writes (counted as failed, fenced).

--from <redis> copies the same keys from another Redis, the one serving
(blue-green from the live cache): pipelined GET + PTTL, written with the
source's remaining TTL (never longer) and, for a declaration with a
version_column, the origin version of the key's version record there, so the
target's leader never replaces a copy with an older row. Keys the source does
not hold, and foreign ones (another type, no TTL, too large: skipped and
counted), are loaded from the origin; --from-only never reads the origin (no
source is opened for loading) and counts them failed. When the access log
cannot be read, the keys are selected by a SCAN of the source.

--ranking chooses where the top keys come from: "auto" (the default) reads the
ranking the leader stores every access_log.rank_interval only when it holds
keys, covers the window and top_n, and was computed after the newest closed
bucket of the access log ended, else ranks the access log live; "live" always
ranks live; "stored" reads the stored ranking and fails (exit 1) when it is not
fresh, naming why, rather than rank the whole window live. The summary names
the ranking read, its age and the buckets it spans.

It shows a progress bar on a terminal (progress logs otherwise) and prints a
summary. Exit codes: 0 when the coverage (keys loaded, values or not-found
sentinels, over keys wanted) reached --min-coverage; 3 when it did not (also when
--timeout cut the run short); 1 on an error (Redis or a source unreachable, the
access log unreadable); 2 for a bad config or flag.`,
		Example: `  hearth prewarm --config config.yaml --redis redis://green-redis:6379/0
  hearth prewarm -c config.yaml --top 50000 --min-coverage 0.95 --timeout 5m
  hearth prewarm -c config.yaml --redis redis://green:6379/0 --from redis://blue:6379/0 --from-only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch ranking {
			case accesslog.ModeAuto, accesslog.ModeLive, accesslog.ModeStored:
			default:
				return fail(exitConfig, fmt.Errorf("--ranking: must be auto, live or stored (got %q)", ranking))
			}
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("top") {
				if top < 0 {
					return fail(exitConfig, fmt.Errorf("--top must be >= 0 (got %d)", top))
				}
				cfg.Prewarm.TopN = top
			}
			if minCoverage < 0 || minCoverage > 1 {
				return fail(exitConfig, fmt.Errorf("--min-coverage must be between 0 and 1 (got %g)", minCoverage))
			}
			if timeout < 0 {
				return fail(exitConfig, fmt.Errorf("--timeout must be >= 0 (got %s)", timeout))
			}
			if fromOnly && fromURL == "" {
				return fail(exitConfig, errors.New("--from-only needs --from"))
			}
			return prewarmOnce(cmd.Context(), g, cfg, redisURL, minCoverage, timeout, overwrite, ranking, fromURL, fromOnly)
		},
	}
	cmd.Flags().StringVar(&redisURL, "redis", "", "target Redis: host:port or a URL (redis://[user:password@]host:port/db, rediss:// for TLS; a Cluster: redis+cluster://host:port,host:port; Sentinels: redis+sentinel://host:port,host:port/<master>[/db]); default: the config's redis")
	cmd.Flags().IntVar(&top, "top", 0, "access-log keys to load (default prewarm.top_n)")
	cmd.Flags().Float64Var(&minCoverage, "min-coverage", 0.99, "exit 3 unless at least this share of the wanted keys was loaded")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long (0: no limit); what was loaded stays loaded")
	cmd.Flags().BoolVar(&overwrite, "overwrite", false, "replace values already present (default: fill absent keys only)")
	cmd.Flags().StringVar(&ranking, "ranking", accesslog.ModeAuto, "where the top keys come from: auto (the stored ranking when fresh, else live), live, or stored (exit 1 when it is not fresh)")
	cmd.Flags().StringVar(&fromURL, "from", "", "copy the wanted keys from this Redis (the one serving; as --redis takes) with their remaining TTLs and version records; keys it lacks are loaded from the origin")
	cmd.Flags().BoolVar(&fromOnly, "from-only", false, "with --from: never load from the origin (no source is opened for loading); keys the source lacks are not loaded")
	_ = cmd.RegisterFlagCompletionFunc("ranking", cobra.FixedCompletions([]string{accesslog.ModeAuto, accesslog.ModeLive, accesslog.ModeStored}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// prewarmOnce is `hearth prewarm`: connect, pre-warm, print the summary, map
// the coverage to the exit code.
func prewarmOnce(ctx context.Context, g *globals, cfg *config.Config, redisURL string, minCoverage float64, timeout time.Duration, overwrite bool, ranking, fromURL string, fromOnly bool) error {
	log := newLogger(g.stderr, cfg.Log)
	rdb, target, err := daemon.RedisURL(cfg.Redis, redisURL, "--redis")
	if err != nil {
		return fail(exitConfig, err)
	}
	defer rdb.Close()
	if err := daemon.PingRedis(ctx, rdb, target); err != nil {
		return fail(exitFail, err)
	}
	var from redis.UniversalClient
	fromName := ""
	if fromURL != "" {
		from, fromName, err = daemon.RedisURL(cfg.Redis, fromURL, "--from")
		if err != nil {
			return fail(exitConfig, err)
		}
		defer from.Close()
		if fromName == target {
			return fail(exitConfig, fmt.Errorf("--from %s: names the Redis being warmed", fromName))
		}
		if err := daemon.PingRedis(ctx, from, fromName); err != nil {
			return fail(exitFail, fmt.Errorf("--from: %w", err))
		}
	}
	pw, err := daemon.OpenPrewarmFrom(ctx, cfg, rdb, overwrite, from, fromOnly, log)
	if err != nil {
		return fail(exitFail, err)
	}
	defer pw.Close()
	if err := pw.SetRanking(ranking); err != nil {
		return fail(exitConfig, fmt.Errorf("--ranking: %w", err))
	}

	runCtx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	progress := newProgress(g.stderr, log)
	rep, err := pw.Run(runCtx, progress.update)
	progress.finish()
	printSummary(g.stdout, target, fromName, rep, pw.Ranking(), minCoverage, pw.Fence(), overwrite)

	timedOut := timeout > 0 && errors.Is(runCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
	if err != nil && !timedOut {
		return fail(exitFail, err)
	}
	if rep.Coverage < minCoverage {
		msg := fmt.Sprintf("coverage %s is below --min-coverage %s", pct(rep.Coverage), pct(minCoverage))
		if timedOut {
			msg += fmt.Sprintf(" (stopped by --timeout %s)", timeout)
		}
		return fail(exitCoverage, errors.New(msg))
	}
	return nil
}

// progress shows a running pre-warm: a bar on a terminal, a log line a second otherwise.
type progress struct {
	mu    sync.Mutex
	out   io.Writer
	tty   bool
	bar   *progressbar.ProgressBar
	log   zerolog.Logger
	start time.Time
	last  time.Time
	p     prewarm.Progress
}

func newProgress(w io.Writer, log zerolog.Logger) *progress {
	f, ok := w.(*os.File)
	return &progress{out: w, tty: ok && isatty.IsTerminal(f.Fd()), log: log, start: time.Now()}
}

func (p *progress) update(pr prewarm.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p = pr
	if p.tty {
		if p.bar == nil {
			p.bar = progressbar.NewOptions(max(pr.Wanted, 1),
				// The rate is ours, in keys/s: the bar's own switches to
				// keys/min and keys/hr while the first batches load.
				progressbar.OptionSetWriter(p.out), progressbar.OptionSetDescription("pre-warming"),
				progressbar.OptionShowCount(),
				progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionSetPredictTime(true),
				progressbar.OptionFullWidth(), progressbar.OptionClearOnFinish())
		}
		if pr.Wanted > 0 && pr.Wanted != p.bar.GetMax() {
			p.bar.ChangeMax(pr.Wanted) // grows while the access log is read
		}
		if s := time.Since(p.start).Seconds(); s > 0 {
			p.bar.Describe(fmt.Sprintf("pre-warming, %.0f keys/s", float64(pr.Done)/s))
		}
		_ = p.bar.Set(pr.Done)
		return
	}
	if now := time.Now(); now.Sub(p.last) >= time.Second && !pr.Reading {
		p.last = now
		p.logLine()
	}
}

func (p *progress) logLine() {
	ratio := 1.0
	if p.p.Wanted > 0 {
		ratio = float64(p.p.Done) / float64(p.p.Wanted)
	}
	p.log.Info().Int("done", p.p.Done).Int("wanted", p.p.Wanted).Int("failed", p.p.Failed).
		Str("progress", pct(ratio)).Msg("pre-warm progress")
}

func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		_ = p.bar.Finish()
		return
	}
	if !p.tty && !p.last.IsZero() {
		p.logLine()
	}
}

func printSummary(w io.Writer, target, from string, r prewarm.Report, rk accesslog.Ranking, minCoverage float64, fence prewarm.Fence, overwrite bool) {
	skipped := fmt.Sprint(r.SkippedTotal())
	if reasons := countList(r.Skipped); reasons != "" {
		skipped += " (" + reasons + ")"
	}
	fmt.Fprintf(w, "pre-warm of %s\n", target)
	mode := "fill absent keys only"
	if overwrite {
		mode = "overwrite"
	}
	switch {
	case fence.Leader != "":
		mode += fmt.Sprintf(", fenced by epoch %d (leader %s)", fence.Epoch, fence.Leader)
	case fence.Fenced:
		mode += fmt.Sprintf(", fenced by epoch %d (no leader now)", fence.Epoch)
	}
	fmt.Fprintf(w, "  mode                  %s\n", mode)
	if r.SourceScanned {
		fmt.Fprintf(w, "  source keys scanned   %d\n", r.Candidates)
	} else {
		fmt.Fprintf(w, "  access-log keys read  %d\n", r.Candidates)
	}
	fmt.Fprintf(w, "  ranking               %s\n", rk.String())
	if r.SourceScanned {
		fmt.Fprintf(w, "  selection             scan of the source (the access log could not be read)\n")
	}
	fmt.Fprintf(w, "  wanted                %d\n", r.Wanted)
	fmt.Fprintf(w, "  written               %d\n", r.Written)
	fmt.Fprintf(w, "  negative              %d\n", r.Negative)
	if r.Copy {
		fmt.Fprintf(w, "  copied from           %s\n", from)
		fmt.Fprintf(w, "  copied                %d (with version record %d)\n", r.Copied, r.RecordsCopied)
		fmt.Fprintf(w, "  loaded from origin    %d\n", r.FromOrigin)
		src := fmt.Sprint(r.SourceMissing)
		if reasons := countList(r.SourceSkipped); reasons != "" {
			src += " (skipped " + reasons + ")"
		}
		fmt.Fprintf(w, "  not in source         %s\n", src)
	}
	fmt.Fprintf(w, "  already present       %d\n", r.Present)
	if r.Fenced > 0 {
		fmt.Fprintf(w, "  failed                %d (fenced %d)\n", r.Failed, r.Fenced)
	} else {
		fmt.Fprintf(w, "  failed                %d\n", r.Failed)
	}
	fmt.Fprintf(w, "  skipped               %s\n", skipped)
	fmt.Fprintf(w, "  coverage              %s (minimum %s)\n", pct(r.Coverage), pct(minCoverage))
	fmt.Fprintf(w, "  duration              %s\n", r.Duration.Round(time.Millisecond))
	fmt.Fprintf(w, "  keys/s                %.0f\n", r.KeysPerSecond)
	if r.Error != "" {
		fmt.Fprintf(w, "  error                 %s\n", r.Error)
	}
}

// countList is "a 1, b 2" of the non-zero counts, sorted.
func countList(m map[string]int) string {
	var out []string
	for k, n := range m {
		if n > 0 {
			out = append(out, fmt.Sprintf("%s %d", k, n))
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func pct(f float64) string { return fmt.Sprintf("%.3f%%", 100*f) }
