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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/internal/redact"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/warmer"
)

func newPrewarmCmd(g *globals) *cobra.Command {
	var (
		redisURL    string
		top         int
		minCoverage float64
		timeout     time.Duration
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

It shows a progress bar on a terminal (progress logs otherwise) and prints a
summary. Exit codes: 0 when the coverage (keys loaded, values or not-found
sentinels, over keys wanted) reached --min-coverage; 3 when it did not (also when
--timeout cut the run short); 1 on an error (Redis or a source unreachable, the
access log unreadable); 2 for a bad config or flag.`,
		Example: `  hearth prewarm --config config.yaml --redis redis://green-redis:6379/0
  hearth prewarm -c config.yaml --top 50000 --min-coverage 0.95 --timeout 5m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
			return prewarmOnce(cmd.Context(), g, cfg, redisURL, minCoverage, timeout)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return fail(exitConfig, err) })
	cmd.Flags().StringVar(&redisURL, "redis", "", "target Redis URL (redis://[user:password@]host:port/db, rediss:// for TLS); default: the config's redis")
	cmd.Flags().IntVar(&top, "top", 0, "access-log keys to load (default prewarm.top_n)")
	cmd.Flags().Float64Var(&minCoverage, "min-coverage", 0.99, "exit 3 unless at least this share of the wanted keys was loaded")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long (0: no limit); what was loaded stays loaded")
	return cmd
}

// prewarmOnce is `hearth prewarm`: connect, pre-warm, print the summary, map
// the coverage to the exit code.
func prewarmOnce(ctx context.Context, g *globals, cfg *config.Config, redisURL string, minCoverage float64, timeout time.Duration) error {
	log := newLogger(g.stderr, cfg.Log)
	rdb, target, err := prewarmTarget(cfg.Redis, redisURL)
	if err != nil {
		return fail(exitConfig, err)
	}
	defer rdb.Close()
	if err := pingTarget(ctx, rdb, target); err != nil {
		return fail(exitFail, err)
	}
	sources, closeSources, err := openSources(ctx, cfg, prometheus.NewRegistry(), log)
	if err != nil {
		return fail(exitFail, err)
	}
	defer closeSources()
	w, err := warmer.New(warmer.Options{
		Store: &warmer.RedisStore{Client: rdb}, Sources: sources, Specs: cfg.Specs(),
		MaxConcurrentLoads: cfg.Refresh.MaxConcurrentLoads, Registerer: prometheus.NewRegistry(), Logger: log,
	})
	if err != nil {
		return fail(exitFail, err)
	}
	al, err := accessLogOf(cfg, sources)
	if err != nil {
		return fail(exitFail, err)
	}

	runCtx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	po := prewarmOptions(cfg, al, "cli")
	progress := newProgress(g.stderr, log)
	po.Progress = progress.update
	log.Info().Str("redis", target).Int("top_n", po.TopN).Dur("window", po.Window).Msg("pre-warming")
	rep, err := w.Prewarm(runCtx, po)
	progress.finish()
	ranking := ""
	if al != nil {
		ranking = al.LastRanking()
	}
	printSummary(g.stdout, target, rep, ranking, minCoverage)

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

// prewarmTarget returns the Redis to warm: the --redis URL if given, else the
// config's, and a name for it that holds no password.
func prewarmTarget(c config.Redis, rawURL string) (redis.UniversalClient, string, error) {
	if rawURL == "" {
		return newRedis(c), strings.Join(c.Addrs, ",") + fmt.Sprintf(" db %d", c.DB), nil
	}
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, "", fmt.Errorf("--redis: %w", redact.URLError(err, rawURL))
	}
	if opts.DialTimeout == 0 { // not in the URL: take the config's
		opts.DialTimeout = c.DialTimeout
	}
	return redis.NewClient(opts), redactRedisURL(rawURL), nil
}

// redactRedisURL masks the password and query values of a Redis URL.
func redactRedisURL(s string) string { return redact.URL(s) }

func pingTarget(ctx context.Context, rdb redis.UniversalClient, target string) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis %s unreachable: %w", target, err)
	}
	return nil
}

// accessLogOf returns the access log of access_log.source, nil when none is configured.
func accessLogOf(cfg *config.Config, sources map[string]warmer.Source) (*accesslog.Log, error) {
	name := cfg.AccessLog.Source
	if name == "" {
		return nil, nil
	}
	src := sources[name]
	for { // behind origin protection (warmer.Guard)
		u, ok := src.(interface{ Unwrap() warmer.Source })
		if !ok {
			break
		}
		src = u.Unwrap()
	}
	pg, ok := src.(*postgres.Source)
	if !ok {
		return nil, fmt.Errorf("access_log.source: %q is not an open postgres source", name)
	}
	return accesslog.New(pg.Pool()).UseRanking(cfg.AccessLog.RankMaxAge()), nil
}

// prewarmOptions turns the config into pre-warm options; the daemon, `hearth
// prewarm` and the admin endpoint all pre-warm with them.
func prewarmOptions(cfg *config.Config, al *accesslog.Log, reason string) warmer.PrewarmOptions {
	po := warmer.PrewarmOptions{
		TopN: cfg.Prewarm.TopN, Window: cfg.Prewarm.Window,
		Concurrency: cfg.Prewarm.Concurrency, Rate: cfg.Prewarm.Rate, Reason: reason,
	}
	if al != nil { // a nil *Log in the interface would not be nil
		po.AccessLog = al
	}
	return po
}

// daemonPrewarm is the daemon's side of pre-warming: the start-up pre-warm a
// new leader runs before it reports ready, the access-log roll-up and ranking,
// and the watch that re-warms when Redis loses its data. The last two run only
// while leading is true.
type daemonPrewarm struct {
	cfg      *config.Config
	w        *warmer.Warmer
	po       warmer.PrewarmOptions
	roller   *accesslog.Roller // nil without an access log, or with roll-up and ranking off
	rewarmer *warmer.Rewarmer  // nil when prewarm.rewarm_check is 0
	log      zerolog.Logger
}

func newDaemonPrewarm(cfg *config.Config, w *warmer.Warmer, sources map[string]warmer.Source,
	rdb redis.UniversalClient, leading func() bool, reg prometheus.Registerer, log zerolog.Logger) (*daemonPrewarm, error) {
	al, err := accessLogOf(cfg, sources)
	if err != nil {
		return nil, err
	}
	p := &daemonPrewarm{cfg: cfg, w: w, po: prewarmOptions(cfg, al, "startup"), log: log}
	if a := cfg.AccessLog; al != nil && (a.RollupInterval > 0 || a.RankInterval > 0) {
		p.roller, err = accesslog.NewRoller(accesslog.RollerOptions{
			Log: al, Client: rdb, Namespace: cfg.Redis.Namespace, Bucket: a.Bucket,
			Interval: a.RollupInterval, Lookback: cfg.Prewarm.Window, Retention: a.Retention,
			RankInterval: a.RankInterval, RankTopN: cfg.Prewarm.TopN,
			Gate: leading, Registerer: reg, Logger: log,
		})
		if err != nil {
			return nil, err
		}
	}
	if cfg.Prewarm.RewarmCheck > 0 {
		p.rewarmer, err = warmer.NewRewarmer(warmer.RewarmOptions{
			Client: rdb, Namespace: cfg.Redis.Namespace, Interval: cfg.Prewarm.RewarmCheck, Gate: leading,
			Warmer: w, Prewarm: p.po, Registerer: reg, Logger: log,
		})
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

// startup is the pre-warm of a new leader, after its start-up load and before
// it reports ready: roll up what Redis still holds of the access log, so that
// the newest closed buckets count, then pre-warm. Errors are logged and counted;
// readiness does not wait for an access log that cannot be read.
func (p *daemonPrewarm) startup(ctx context.Context) {
	if p.roller != nil && p.cfg.AccessLog.RollupInterval > 0 {
		if res, err := p.roller.RollupOnce(ctx); err != nil {
			p.log.Warn().Err(err).Msg("start-up access-log roll-up incomplete")
		} else if res.Buckets > 0 {
			p.log.Info().Int("buckets", res.Buckets).Int("rows", res.Rows).Msg("access log rolled up")
		}
	}
	if p.cfg.Prewarm.Enabled && ctx.Err() == nil {
		_, _ = p.w.Prewarm(ctx, p.po)
	}
	// Redis is warm: from here on, a loss is re-warmed.
	if p.rewarmer != nil && ctx.Err() == nil {
		if err := p.rewarmer.Mark(ctx); err != nil {
			p.log.Warn().Err(err).Msg("re-warm watch not armed; the next check arms it")
		}
	}
}

// options are the pre-warm options of this daemon, for a run started for the
// given reason, e.g. by the admin API: w.StartPrewarm(ctx, p.options("admin")).
func (p *daemonPrewarm) options(reason string) warmer.PrewarmOptions {
	po := p.po
	po.Reason = reason
	return po
}

// open starts the roll-up loop and the re-warm watch; they act only while leading.
func (p *daemonPrewarm) open(ctx context.Context) error {
	if p.roller != nil {
		if err := p.roller.Open(ctx); err != nil {
			return err
		}
	}
	if p.rewarmer != nil {
		if err := p.rewarmer.Open(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (p *daemonPrewarm) close(ctx context.Context) {
	if p.rewarmer != nil {
		if err := p.rewarmer.Close(ctx); err != nil {
			p.log.Warn().Err(err).Msg("close rewarmer")
		}
	}
	if p.roller != nil {
		if err := p.roller.Close(ctx); err != nil {
			p.log.Warn().Err(err).Msg("close access-log roller")
		}
	}
}

// adminHooks is the pre-warm engine as the admin API sees it: POST
// /admin/prewarm runs the daemon's pre-warm into its own Redis (through the
// leader's fence), unless one runs; GET /admin/prewarm reads the warmer's
// pre-warm state, the same one the start-up pre-warm and re-warms update.
func (p *daemonPrewarm) adminHooks() *prewarmHooks {
	return &prewarmHooks{
		Start: func(ctx context.Context) (<-chan warmer.PrewarmReport, error) {
			return p.w.StartPrewarm(ctx, p.options("admin"))
		},
	}
}

// progress shows a running pre-warm: a bar on a terminal, a log line a second otherwise.
type progress struct {
	mu   sync.Mutex
	out  io.Writer
	tty  bool
	bar  *progressbar.ProgressBar
	log  zerolog.Logger
	last time.Time
	p    warmer.PrewarmProgress
}

func newProgress(w io.Writer, log zerolog.Logger) *progress {
	f, ok := w.(*os.File)
	return &progress{out: w, tty: ok && isatty.IsTerminal(f.Fd()), log: log}
}

func (p *progress) update(pr warmer.PrewarmProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p = pr
	if p.tty {
		if p.bar == nil {
			p.bar = progressbar.NewOptions(max(pr.Wanted, 1),
				progressbar.OptionSetWriter(p.out), progressbar.OptionSetDescription("pre-warming"),
				progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("keys"),
				progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionSetPredictTime(true),
				progressbar.OptionFullWidth(), progressbar.OptionClearOnFinish())
		}
		if pr.Wanted > 0 && pr.Wanted != p.bar.GetMax() {
			p.bar.ChangeMax(pr.Wanted) // grows while the access log is read
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

func printSummary(w io.Writer, target string, r warmer.PrewarmReport, ranking string, minCoverage float64) {
	reasons := make([]string, 0, len(r.Skipped))
	for k, n := range r.Skipped {
		if n > 0 {
			reasons = append(reasons, fmt.Sprintf("%s %d", k, n))
		}
	}
	sort.Strings(reasons)
	skipped := fmt.Sprint(r.SkippedTotal())
	if len(reasons) > 0 {
		skipped += " (" + strings.Join(reasons, ", ") + ")"
	}
	fmt.Fprintf(w, "pre-warm of %s\n", target)
	if ranking == "" {
		ranking = "none"
	}
	fmt.Fprintf(w, "  access-log keys read  %d (ranking: %s)\n", r.Candidates, ranking)
	fmt.Fprintf(w, "  wanted                %d\n", r.Wanted)
	fmt.Fprintf(w, "  written               %d\n", r.Written)
	fmt.Fprintf(w, "  negative              %d\n", r.Negative)
	fmt.Fprintf(w, "  failed                %d\n", r.Failed)
	fmt.Fprintf(w, "  skipped               %s\n", skipped)
	fmt.Fprintf(w, "  coverage              %s (minimum %s)\n", pct(r.Coverage), pct(minCoverage))
	fmt.Fprintf(w, "  duration              %s\n", r.Duration.Round(time.Millisecond))
	fmt.Fprintf(w, "  keys/s                %.0f\n", r.KeysPerSecond)
	if r.Error != "" {
		fmt.Fprintf(w, "  error                 %s\n", r.Error)
	}
}

func pct(f float64) string { return fmt.Sprintf("%.3f%%", 100*f) }
