package kafkabroker

import (
	"context"
	"fmt"
	"sync"

	"github.com/txoutbox/txoutbox/core"
)

// publishByAggregate publishes events with send, one aggregate's events in
// order and up to conc aggregates at once, and reports failures per event.
// Events without an aggregate are independent of each other.
func publishByAggregate(ctx context.Context, events []core.Event, conc int, send func(context.Context, *core.Event) error) error {
	if len(events) == 0 {
		return nil
	}
	var groups [][]int
	byAgg := map[string]int{}
	for i := range events {
		agg := events[i].AggregateID
		if agg == "" {
			groups = append(groups, []int{i})
			continue
		}
		g, ok := byAgg[agg]
		if !ok {
			g = len(groups)
			byAgg[agg] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	be := core.NewBatchError(len(events))
	sem := make(chan struct{}, max(conc, 1))
	var wg sync.WaitGroup
	for _, g := range groups {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			var failed error
			for _, i := range g {
				ev := &events[i]
				switch {
				case failed != nil:
					// Distinct indices per goroutine: no lock needed on be.Errs.
					be.Errs[i] = fmt.Errorf("%w: event %s after %s", ErrEarlierFailed, ev.ID, failed)
				case ctx.Err() != nil:
					be.Errs[i] = ctx.Err()
					failed = be.Errs[i]
				default:
					if err := send(ctx, ev); err != nil {
						be.Errs[i] = err
						failed = err
					}
				}
			}
		}()
	}
	wg.Wait()
	return be.ErrOrNil()
}
