package redistest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func ms(m int) time.Time { return time.UnixMilli(int64(m)) }

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

func TestMaxUnitsInWindowSelf(t *testing.T) {
	per := 100 * time.Millisecond
	gs := []Grant{{ms(0), 3}, {ms(50), 4}, {ms(99), 2}, {ms(100), 5}, {ms(199), 1}}
	assert.Equal(t, 11, MaxUnitsInWindow(gs, per), "[50, 150) holds 4+2+5")
	assert.Equal(t, 0, MaxUnitsInWindow(nil, per))
}

// The checker must be able to fail: each broken history below is one a
// broken gate would produce, and each is flagged at the start that broke
// the rule, while the honest variant next to it passes.
func TestCheckWindowsCatchesBrokenHistories(t *testing.T) {
	per := 100 * time.Millisecond
	made := Rate{N: 10, Per: per}

	t.Run("weights", func(t *testing.T) {
		// 10 units per 100ms: 4+6 fit, and 6 more come per after the 4.
		ok := []Grant{{ms(0), 4}, {ms(10), 6}, {ms(100), 4}, {ms(110), 6}}
		assert.Empty(t, CheckWindows(ok, []Rate{made}))
		// A gate that counts starts, not units: three starts of 4.
		bad := []Grant{{ms(0), 4}, {ms(10), 4}, {ms(20), 4}}
		v := CheckWindows(bad, []Rate{made})
		if assert.Len(t, v, 1) {
			assert.Equal(t, ms(20), v[0].At)
			assert.Equal(t, 12, v[0].Units)
		}
		// A gate that lets a token back one microsecond early.
		early := []Grant{{ms(0), 10}, {ms(100).Add(-time.Microsecond), 1}}
		assert.Len(t, CheckWindows(early, []Rate{made}), 1)
	})

	t.Run("lowered n", func(t *testing.T) {
		// 10 per 100ms, lowered to 4 at 50ms: the 8 units granted at 0ms are
		// in the window of every start until 100ms.
		rates := []Rate{made, {At: ms(50), N: 4, Per: per}}
		ok := []Grant{{ms(0), 8}, {ms(100), 4}}
		assert.Empty(t, CheckWindows(ok, rates))
		// A gate that forgets its window when the rate changes (Redisson's
		// setRate resets the state): 4 more at once after the change.
		reset := []Grant{{ms(0), 8}, {ms(51), 4}}
		v := CheckWindows(reset, rates)
		if assert.Len(t, v, 1) {
			assert.Equal(t, 12, v[0].Units)
			assert.Equal(t, 4, v[0].Rate.N)
		}
		// A gate that keeps the old n after the change.
		assert.Len(t, CheckWindows([]Grant{{ms(0), 2}, {ms(60), 3}}, rates), 1)
		// A start that takes none of the limit's units is not held to it.
		assert.Empty(t, CheckWindows([]Grant{{ms(0), 8}, {ms(60), 0}}, rates))
	})

	t.Run("raised n", func(t *testing.T) {
		rates := []Rate{made, {At: ms(50), N: 20, Per: per}}
		// The difference is admitted at once.
		assert.Empty(t, CheckWindows([]Grant{{ms(0), 10}, {ms(51), 10}}, rates))
		// Before the change the old n holds.
		assert.Len(t, CheckWindows([]Grant{{ms(0), 10}, {ms(40), 10}}, rates), 1)
	})

	t.Run("per changes", func(t *testing.T) {
		// Shortened to 50ms at 60ms: the 10 units of 0ms left the new window
		// at 50ms, so 10 more at 61ms are fine, and 10 more at 70ms are not.
		short := []Rate{made, {At: ms(60), N: 10, Per: 50 * time.Millisecond}}
		assert.Empty(t, CheckWindows([]Grant{{ms(0), 10}, {ms(61), 10}}, short))
		assert.Len(t, CheckWindows([]Grant{{ms(0), 10}, {ms(61), 10}, {ms(70), 1}}, short), 1)

		// Lengthened to 1s at 150ms: the window of a start after the change
		// is the whole second before it, grants that had left the old window
		// included. 5 more fit in (1ms, 1001ms].
		long := []Rate{made, {At: ms(150), N: 10, Per: time.Second}}
		assert.Empty(t, CheckWindows([]Grant{{ms(0), 10}, {ms(110), 5}, {ms(1001), 5}}, long))
		// A gate that counts only what the old window held at the change
		// (the grants after 150-100 = 50ms) admits more at once.
		v := CheckWindows([]Grant{{ms(0), 10}, {ms(110), 5}, {ms(160), 5}}, long)
		if assert.Len(t, v, 1) {
			assert.Equal(t, ms(160).Add(-time.Second), v[0].From, "the window is the new per long")
			assert.Equal(t, 20, v[0].Units)
		}
		// A second change keeps counting the grants before the first one.
		twice := append(long, Rate{At: ms(170), N: 16, Per: time.Second})
		assert.Len(t, CheckWindows([]Grant{{ms(0), 10}, {ms(110), 5}, {ms(180), 2}}, twice), 1)
		assert.Empty(t, CheckWindows([]Grant{{ms(0), 10}, {ms(110), 5}, {ms(180), 1}}, twice))
	})
}
