// Package otel traces redsem's acquisitions with OpenTelemetry: a span for
// the wait and one for the hold of every acquisition of every kind
// (semaphore, mutex, read-write lock, rate gate), parented to the caller's
// context, with the name, kind, fence and outcome as attributes. Pass an
// *Observer to redsem.WithObserver and rate.WithObserver; it forwards the
// events to another Observer (metrics) if given one.
//
// It is a module of its own, so the root module never depends on
// OpenTelemetry. docs/tracing.md tells the rest.
package otel

import (
	"context"
	"errors"
	"time"

	otelapi "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/rate"
)

// Span names and attribute keys.
const (
	// WaitSpan is the name of an acquisition's span, from its call to its
	// outcome.
	WaitSpan = "redsem.wait"
	// HoldSpan is the name of a lease's span, from its grant to its end,
	// a sibling of its WaitSpan under the caller's span.
	HoldSpan = "redsem.hold"

	// KindKey is "semaphore", "mutex", "rwmutex.read", "rwmutex.write",
	// "election" (a Campaign) or "rate"; NameKey the semaphore's, lock's,
	// election's or gate's name; FenceKey the
	// grant's fence (not on a rate start); OutcomeKey one of "granted",
	// "busy", "timeout", "canceled", "error" (a wait) or "released",
	// "expired", "lost" (a hold).
	KindKey    = attribute.Key("redsem.kind")
	NameKey    = attribute.Key("redsem.name")
	FenceKey   = attribute.Key("redsem.fence")
	OutcomeKey = attribute.Key("redsem.outcome")
)

// Observer is a redsem.ContextObserver (and a rate.Observer) that records
// spans. It is safe for concurrent use.
type Observer struct {
	tracer trace.Tracer
	next   redsem.Observer
}

var (
	_ redsem.ContextObserver = (*Observer)(nil)
	_ redsem.RefreshObserver = (*Observer)(nil)
	_ rate.Observer          = (*Observer)(nil)
)

// New returns an Observer recording spans through tp (the global
// TracerProvider if nil) and forwarding every event to next, if not nil
// (e.g. an *admin.Counters).
func New(tp trace.TracerProvider, next redsem.Observer) *Observer {
	if tp == nil {
		tp = otelapi.GetTracerProvider()
	}
	return &Observer{tracer: tp.Tracer("github.com/redsem/redsem/otel"), next: next}
}

// acquisition is what the spans of one acquisition share, carried in the
// contexts the Observer's methods hand each other.
type acquisition struct {
	parent  context.Context // the caller's span, without its cancellation or values
	attrs   []attribute.KeyValue
	granted time.Time
	fence   int64
}

type acquisitionKey struct{}

// WaitStarted starts the WaitSpan under ctx.
func (o *Observer) WaitStarted(ctx context.Context, kind, name string) context.Context {
	a := &acquisition{
		parent: trace.ContextWithSpan(context.Background(), trace.SpanFromContext(ctx)),
		attrs:  []attribute.KeyValue{KindKey.String(kind), NameKey.String(name)},
	}
	ctx, _ = o.tracer.Start(ctx, WaitSpan, trace.WithAttributes(a.attrs...))
	return context.WithValue(ctx, acquisitionKey{}, a)
}

// WaitEnded ends the WaitSpan with the outcome and fence.
func (o *Observer) WaitEnded(ctx context.Context, fence int64, err error) context.Context {
	a, _ := ctx.Value(acquisitionKey{}).(*acquisition)
	span := trace.SpanFromContext(ctx)
	outcome := waitOutcome(err)
	span.SetAttributes(OutcomeKey.String(outcome))
	if fence != 0 {
		span.SetAttributes(FenceKey.Int64(fence))
	}
	if outcome == "error" {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	if a != nil {
		a.granted, a.fence = time.Now(), fence
	}
	return ctx
}

// HoldEnded records the HoldSpan, from the grant to now, beside the
// WaitSpan under the caller's span.
func (o *Observer) HoldEnded(ctx context.Context, cause error) {
	a, ok := ctx.Value(acquisitionKey{}).(*acquisition)
	if !ok {
		return
	}
	attrs := append([]attribute.KeyValue{FenceKey.Int64(a.fence), OutcomeKey.String(holdOutcome(cause))}, a.attrs...)
	_, span := o.tracer.Start(a.parent, HoldSpan, trace.WithTimestamp(a.granted), trace.WithAttributes(attrs...))
	if !errors.Is(cause, redsem.ErrReleased) {
		span.SetStatus(codes.Error, cause.Error())
	}
	span.End()
}

// waitOutcome names an acquisition's outcome.
func waitOutcome(err error) string {
	switch {
	case err == nil:
		return "granted"
	case errors.Is(err, redsem.ErrNoToken), errors.Is(err, rate.ErrRateLimited):
		return "busy"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "error"
}

// holdOutcome names how a lease ended.
func holdOutcome(cause error) string {
	switch {
	case errors.Is(cause, redsem.ErrReleased):
		return "released"
	case errors.Is(cause, redsem.ErrLeaseExpired):
		return "expired"
	}
	return "lost"
}

// Acquired forwards to the next Observer.
func (o *Observer) Acquired(name string, wait time.Duration) {
	if o.next != nil {
		o.next.Acquired(name, wait)
	}
}

// AcquireFailed forwards to the next Observer.
func (o *Observer) AcquireFailed(name string, wait time.Duration, err error) {
	if o.next != nil {
		o.next.AcquireFailed(name, wait, err)
	}
}

// Released forwards to the next Observer.
func (o *Observer) Released(name string, held time.Duration) {
	if o.next != nil {
		o.next.Released(name, held)
	}
}

// LeaseLost forwards to the next Observer.
func (o *Observer) LeaseLost(name string, held time.Duration, cause error) {
	if o.next != nil {
		o.next.LeaseLost(name, held, cause)
	}
}

// RefreshFailed forwards to the next Observer if it is a
// redsem.RefreshObserver. It records no span: a background refresh has no
// caller; the hold's span says how the lease ended.
func (o *Observer) RefreshFailed(name string, err error) {
	if ro, ok := o.next.(redsem.RefreshObserver); ok {
		ro.RefreshFailed(name, err)
	}
}
