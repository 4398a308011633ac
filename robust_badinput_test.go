package redsem

import (
	"reflect"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"

	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/rate"
)

// Each package takes only its own options: a semaphore's option given to
// rate.New (redsem.WithTTL has no meaning for a rate gate), or a rate
// gate's to NewSemaphore, does not compile, since neither option type can
// implement the other's unexported method. The table lists every option of
// both packages.
func TestOptionsAreTypedPerPackage(t *testing.T) {
	pool := &redis.Pool{}
	semOption := reflect.TypeOf((*Option)(nil)).Elem()
	rateOption := reflect.TypeOf((*rate.Option)(nil)).Elem()
	for name, o := range map[string]Option{
		"WithPrefix": WithPrefix("p:"), "WithTTL": WithTTL(time.Second), "WithGrace": WithGrace(0),
		"WithLabel": WithLabel("l"), "WithFixedTTL": WithFixedTTL(), "WithAutoRefresh": WithAutoRefresh(),
		"WithBlockingPool": WithBlockingPool(pool), "WithAdoptSize": WithAdoptSize(),
		"WithWaitConnections": WithWaitConnections(1), "WithObserver": WithObserver(&admin.Counters{}),
	} {
		assert.True(t, reflect.TypeOf(o).Implements(semOption), name)
		assert.False(t, reflect.TypeOf(o).Implements(rateOption), "redsem.%s is a rate.Option", name)
	}
	for name, o := range map[string]rate.Option{
		"WithPrefix": rate.WithPrefix("p:"), "WithGrace": rate.WithGrace(0),
		"WithBlockingPool": rate.WithBlockingPool(pool), "WithObserver": rate.WithObserver(&admin.Counters{}),
	} {
		assert.True(t, reflect.TypeOf(o).Implements(rateOption), name)
		assert.False(t, reflect.TypeOf(o).Implements(semOption), "rate.%s is a redsem.Option", name)
	}
}
