// Package exporter is a Prometheus collector for every semaphore, mutex,
// read-write lock and rate gate under a redsem key prefix. Each scrape is one admin.ReadFleet:
// it finds the names by SCAN over the meta keys (never KEYS, at most Limit
// names and MaxScan SCAN calls, admin.ScanLimits) and reads each one in one
// script call, so a scrape costs Redis a bounded scan plus one short
// read-only script per name. Nothing is cached between scrapes.
//
// It lives in a module of its own so that the redsem library does not
// depend on the Prometheus client. "redsem exporter" (the redsem command,
// github.com/redsem/redsem/cmd/redsem) serves it on /metrics.
//
// A scrape that cannot read the fleet reports redsem_scrape_error 1 and no
// per-name metric; with Options.ErrorLog set it also logs why (and which
// names could not be read), at most once per Options.LogEvery for the same
// reason.
//
// # Metrics
//
// Every per-name metric has the labels name (as given to the library) and
// kind ("semaphore" for semaphores, mutexes and weighted semaphores;
// "rwmutex" for read-write locks; "rate" for rate gates).
//
//	redsem_size                          slots (tokens) of the semaphore
//	redsem_holders                       tokens held now (a weighted lease of k counts k)
//	redsem_available                     valid tokens free now (rate gate: starts possible now)
//	redsem_waiting                       acquisitions (waiters) registered as blocked
//	redsem_withheld                      tokens kept off the list while a shrink drains
//	redsem_stray_tokens                  list elements that are not valid free tokens
//	redsem_rejected_tokens_total         stray tokens dropped so far (counter)
//	redsem_expired_leases                leases past their deadline, not yet reclaimed
//	redsem_oldest_holder_age_seconds     how long the oldest lease has been held (0: none)
//	redsem_rate_limit                    starts a rate gate admits per interval
//	redsem_rate_interval_seconds         the rate gate's interval
//	redsem_rate_window_starts            starts granted in the last interval
//
// And for the scrape itself (no labels):
//
//	redsem_scrape_error                  1 when the last scrape could not read the fleet
//	redsem_scrape_names                  names reported by the last scrape
//	redsem_scrape_truncated              1 when more names exist than the limit let in, or the SCAN cap cut the scan short
//	redsem_scrape_failed_names           names whose keys could not be read (wrong type, corrupt)
//	redsem_scrape_duration_seconds       how long the last scrape's reads took
package exporter

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
)

// Options configure a Collector. The zero value of each field means its
// default.
type Options struct {
	// Prefix is the key prefix to scan; "" means redsem.DefaultPrefix. Use
	// AllowEmptyPrefix to scan keys without a prefix.
	Prefix           string
	AllowEmptyPrefix bool
	// Limit caps the names one scrape reports; default
	// admin.DefaultScanLimit.
	Limit int
	// MaxScan caps the SCAN calls of one scrape (about 500 keys examined
	// each); default admin.DefaultMaxScan. When it cuts the walk of the
	// keyspace short, redsem_scrape_truncated is 1.
	MaxScan int
	// Timeout bounds one scrape's Redis work; default 10s.
	Timeout time.Duration
	// ErrorLog, if set, gets a line for each scrape that could not read the
	// fleet and for each name that could not be read, with the reason. A
	// line already logged within LogEvery is not repeated; the next one
	// after that says how many were held back. nil: nothing is logged.
	ErrorLog *log.Logger
	// LogEvery is the least time between two log lines of the same
	// reason; default 30s.
	LogEvery time.Duration
}

// Collector is a prometheus.Collector that reads the fleet under one
// prefix at every scrape. It is safe for concurrent scrapes (each reads on
// its own).
type Collector struct {
	pool    redsem.Pool
	prefix  string
	limit   int
	maxScan int
	timeout time.Duration
	log     *limitedLog
}

// New returns a Collector that reads through pool. It fails with
// redsem.ErrInvalidOption for a prefix redsem would refuse or a negative
// limit, max scan or timeout. It does no I/O.
func New(pool redsem.Pool, o Options) (*Collector, error) {
	c := &Collector{pool: pool, prefix: o.Prefix, limit: o.Limit, maxScan: o.MaxScan, timeout: o.Timeout}
	if o.ErrorLog != nil {
		every := o.LogEvery
		if every <= 0 {
			every = 30 * time.Second
		}
		c.log = &limitedLog{out: o.ErrorLog, every: every, last: map[string]*logged{}}
	}
	if c.prefix == "" && !o.AllowEmptyPrefix {
		c.prefix = redsem.DefaultPrefix
	}
	if c.limit == 0 {
		c.limit = admin.DefaultScanLimit
	}
	if c.maxScan == 0 {
		c.maxScan = admin.DefaultMaxScan
	}
	if c.timeout == 0 {
		c.timeout = 10 * time.Second
	}
	if pool == nil || c.limit < 0 || c.maxScan < 0 || c.timeout < 0 {
		return nil, fmt.Errorf("%w: exporter needs a pool, a limit, a max scan and a timeout of at least 0", redsem.ErrInvalidOption)
	}
	// Judge the prefix now, as the library does, not at the first scrape.
	if _, err := admin.New(pool, c.prefix, "x"); err != nil {
		return nil, err
	}
	return c, nil
}

var perName = []string{"kind", "name"}

func desc(name, help string, labels []string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName("redsem", "", name), help, labels, nil)
}

var (
	sizeDesc      = desc("size", "Slots (tokens) of the semaphore, as stored in Redis.", perName)
	holdersDesc   = desc("holders", "Tokens held now; a weighted lease of k tokens counts k; a read-write lock's leases, readers and writer; an election's leader (0 or 1).", perName)
	availableDesc = desc("available", "Valid tokens free now; for a rate gate, the starts possible now.", perName)
	waitingDesc   = desc("waiting", "Acquisitions registered as blocked (waiters in a rate gate's or a read-write lock's queue, an election's campaigners).", perName)
	withheldDesc  = desc("withheld", "Valid tokens kept off the list while a shrink drains.", perName)
	strayDesc     = desc("stray_tokens", "Token-list elements that are not valid free tokens (forged, duplicated, of an older epoch).", perName)
	rejectedDesc  = desc("rejected_tokens_total", "Stray tokens dropped so far.", perName)
	expiredDesc   = desc("expired_leases", "Leases past their deadline whose token no client has reclaimed yet.", perName)
	oldestDesc    = desc("oldest_holder_age_seconds", "How long the oldest current lease has been held, by Redis time; 0 without holders.", perName)
	limitDesc     = desc("rate_limit", "Starts the rate gate admits per interval.", perName)
	intervalDesc  = desc("rate_interval_seconds", "The rate gate's interval.", perName)
	startsDesc    = desc("rate_window_starts", "Starts the rate gate granted in the last interval.", perName)
	termDesc      = desc("election_term", "The term of the election's leader (its fence); 0 when nobody leads.", perName)
	observersDesc = desc("election_observers", "Observers registered on the election (Election.Observe).", perName)

	errorDesc    = desc("scrape_error", "1 when the last scrape could not read the fleet from Redis, else 0.", nil)
	namesDesc    = desc("scrape_names", "Names (semaphores, mutexes, read-write locks and rate gates) reported by the last scrape.", nil)
	truncDesc    = desc("scrape_truncated", "1 when more names exist under the prefix than the limit let in, or the SCAN cap stopped the scan before the keyspace was walked.", nil)
	failedDesc   = desc("scrape_failed_names", "Names whose keys could not be read (a key of the wrong type, a corrupt record).", nil)
	durationDesc = desc("scrape_duration_seconds", "How long the last scrape's Redis reads took.", nil)
	allDescs     = []*prometheus.Desc{sizeDesc, holdersDesc, availableDesc, waitingDesc, withheldDesc,
		strayDesc, rejectedDesc, expiredDesc, oldestDesc, limitDesc, intervalDesc, startsDesc,
		termDesc, observersDesc, errorDesc, namesDesc, truncDesc, failedDesc, durationDesc}
)

// Describe sends the descriptors of every metric the Collector reports.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect reads the fleet and sends its metrics. When Redis cannot be read
// it sends redsem_scrape_error 1 and no per-name metric.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	began := time.Now()
	fl, err := admin.ReadFleet(ctx, c.pool, c.prefix, admin.ScanLimits{Limit: c.limit, MaxScan: c.maxScan})
	took := time.Since(began).Seconds()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(durationDesc, took)
	if err != nil {
		c.log.printf("scrape of prefix %q failed: %v", c.prefix, err)
		gauge(errorDesc, 1)
		return
	}
	for _, f := range fl.Failed {
		c.log.printf("cannot read %s %q: %v", f.Kind, f.Name, f.Err)
	}
	gauge(errorDesc, 0)
	gauge(namesDesc, float64(len(fl.Semaphores)+len(fl.RWMutexes)+len(fl.RateGates)+len(fl.Elections)))
	gauge(failedDesc, float64(len(fl.Failed)))
	truncated := 0.0
	if fl.Truncated {
		truncated = 1
	}
	gauge(truncDesc, truncated)

	const sem, rate = string(admin.KindSemaphore), string(admin.KindRate)
	for _, st := range fl.Semaphores {
		gauge(sizeDesc, float64(st.Size), sem, st.Name)
		gauge(holdersDesc, float64(len(st.Holders)), sem, st.Name)
		gauge(availableDesc, float64(st.Available), sem, st.Name)
		gauge(waitingDesc, float64(st.Waiting), sem, st.Name)
		gauge(withheldDesc, float64(st.Withheld), sem, st.Name)
		gauge(strayDesc, float64(st.Stray), sem, st.Name)
		ch <- prometheus.MustNewConstMetric(rejectedDesc, prometheus.CounterValue, float64(st.Rejected), sem, st.Name)
		gauge(expiredDesc, float64(st.Expired()), sem, st.Name)
		gauge(oldestDesc, st.OldestHold().Seconds(), sem, st.Name)
	}
	const rw = string(admin.KindRWMutex)
	for _, st := range fl.RWMutexes {
		held := len(st.Readers)
		if st.Writer != nil {
			held++
		}
		gauge(holdersDesc, float64(held), rw, st.Name)
		gauge(waitingDesc, float64(len(st.Queue)), rw, st.Name)
	}
	const el = string(admin.KindElection)
	for _, st := range fl.Elections {
		leading, term := 0.0, 0.0
		if st.Leader != nil {
			leading, term = 1, float64(st.Leader.Fence)
		}
		gauge(holdersDesc, leading, el, st.Name)
		gauge(waitingDesc, float64(st.Waiting), el, st.Name)
		gauge(termDesc, term, el, st.Name)
		gauge(observersDesc, float64(st.Observers), el, st.Name)
	}
	for _, st := range fl.RateGates {
		gauge(limitDesc, float64(st.Limit), rate, st.Name)
		gauge(intervalDesc, st.Per.Seconds(), rate, st.Name)
		gauge(startsDesc, float64(st.Started), rate, st.Name)
		// Tokens whose return time has passed are free to the next start,
		// which puts them back first.
		gauge(availableDesc, float64(st.Available), rate, st.Name)
		gauge(waitingDesc, float64(st.Waiting), rate, st.Name)
		gauge(strayDesc, float64(st.Stray), rate, st.Name)
		ch <- prometheus.MustNewConstMetric(rejectedDesc, prometheus.CounterValue, float64(st.Rejected), rate, st.Name)
	}
}

// limitedLog prints a line unless the same line was printed less than every
// ago; the next one printed says how many were held back meanwhile. It
// forgets lines not seen for every, so it holds at most the distinct
// reasons of the last interval.
type limitedLog struct {
	out   *log.Logger
	every time.Duration
	mu    sync.Mutex
	last  map[string]*logged
}

type logged struct {
	at   time.Time
	held int
}

func (l *limitedLog) printf(format string, v ...interface{}) {
	if l == nil {
		return
	}
	reason := fmt.Sprintf(format, v...)
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, e := range l.last {
		if now.Sub(e.at) >= 2*l.every {
			delete(l.last, k)
		}
	}
	e := l.last[reason]
	if e != nil && now.Sub(e.at) < l.every {
		e.held++
		return
	}
	line := reason
	if e != nil && e.held > 0 {
		line += fmt.Sprintf(" (and %d more times since %s)", e.held, e.at.Format(time.RFC3339))
	}
	l.last[reason] = &logged{at: now}
	l.out.Print(line)
}
