package redistest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestMaxInWindowSelf(t *testing.T) {
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, time.UnixMilli(int64(m)))
		}
		return ts
	}
	assert.Equal(t, 2, MaxInWindow(at(0, 99, 100, 199), 100*time.Millisecond))
	assert.Equal(t, 3, MaxInWindow(at(0, 50, 99, 100), 100*time.Millisecond))
	assert.Equal(t, 1, MaxInWindow(at(0, 100, 200), 100*time.Millisecond))
	assert.Equal(t, 0, MaxInWindow(nil, time.Second))
}
