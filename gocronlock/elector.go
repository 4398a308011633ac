package gocronlock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/redsem/redsem"
)

// ErrNotLeader is IsLeader's error on a replica that does not lead.
var ErrNotLeader = errors.New("gocronlock: not the leader")

// Elector is a gocron.Elector on a redsem election: pass it to
// gocron.WithDistributedElector, and only the replica that leads runs the
// scheduler's jobs. Each Elector campaigns in the background from
// NewElector until Close; when the leader resigns (Close) or dies (its
// lease expires, within one TTL), the longest-waiting replica leads next.
// It is safe for concurrent use.
type Elector struct {
	election *redsem.Election
	value    string
	cancel   context.CancelFunc
	done     chan struct{}

	mu       sync.Mutex
	lead     *redsem.Leadership // nil while not leading
	closeErr error              // the resignation's at Close
}

var _ gocron.Elector = (*Elector)(nil)

// retryCampaign is how long the campaign waits after a failed Campaign
// (Redis unreachable for longer than a wait outlasts it, say).
const retryCampaign = time.Second

// NewElector starts campaigning in the election "gocron:<name>" on pool,
// announcing value (this replica's host name, say: redsem.Election's Leader
// and Observe report it). opts are the election's (redsem.WithTTL,
// WithPrefix...). Close it when the scheduler shuts down.
func NewElector(pool redsem.Pool, name, value string, opts ...redsem.Option) (*Elector, error) {
	election, err := redsem.NewElection(pool, "gocron:"+name, opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	el := &Elector{election: election, value: value, cancel: cancel, done: make(chan struct{})}
	go el.campaign(ctx)
	return el, nil
}

// IsLeader returns nil while this replica leads and ErrNotLeader
// otherwise: gocron then skips the run here. It asks no Redis: the
// leadership's lease refreshes itself, and Valid reads its deadline.
func (el *Elector) IsLeader(context.Context) error {
	el.mu.Lock()
	defer el.mu.Unlock()
	if !el.lead.Valid() {
		return ErrNotLeader
	}
	return nil
}

// Close stops campaigning and resigns the leadership if it holds it, so
// that another replica leads at once. It returns when the campaign has
// ended, with the resignation's error (Leadership.Resign's) if it led;
// call it once.
func (el *Elector) Close() error {
	el.cancel()
	<-el.done
	return el.closeErr
}

// campaign leads, whenever it can, until ctx ends: Campaign, hold the
// leadership until it is lost, then campaign again.
func (el *Elector) campaign(ctx context.Context) {
	defer close(el.done)
	for ctx.Err() == nil {
		lead, err := el.election.Campaign(ctx, el.value)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(retryCampaign):
			}
			continue
		}
		el.set(lead)
		select {
		case <-ctx.Done():
		case <-lead.Context().Done():
		}
		el.set(nil)
		err = lead.Resign(context.Background()) // bounded by the library; ErrLeaseLost once lost
		if ctx.Err() != nil {
			el.closeErr = err
		}
	}
}

func (el *Elector) set(lead *redsem.Leadership) {
	el.mu.Lock()
	el.lead = lead
	el.mu.Unlock()
}
