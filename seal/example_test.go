package seal_test

import (
	"context"
	"fmt"
	"log"

	"gocloud.dev/secrets"
	_ "gocloud.dev/secrets/localsecrets" // base64key://

	"github.com/txoutbox/txoutbox/core"
	"github.com/txoutbox/txoutbox/seal"
)

// Seal an event as Enqueue would (the hook), and open it as the relay does
// before publishing. A real service keeps its key in a KMS (awskms://,
// gcpkms://, ...) or at least out of the code.
func Example() {
	ctx := context.Background()
	keeper, err := secrets.OpenKeeper(ctx, "base64key://smGbjm71Nxd1Ig5FS0wj9SlbzAIrnolCz9bQQ6uAhl4=")
	if err != nil {
		log.Fatal(err)
	}
	defer keeper.Close()
	sealer, err := seal.New(seal.Options{Key: seal.Key{ID: "2026-12", Keeper: keeper}})
	if err != nil {
		log.Fatal(err)
	}
	ev, err := core.NewEvent("customer", "7", "customer.updated", map[string]string{"email": "ada@example.com"})
	if err != nil {
		log.Fatal(err)
	}
	// sqlxoutbox.Options{Hooks: []core.EnqueueHook{sealer.Hook()}} does
	// this to every event it enqueues.
	if err := sealer.Hook()(ctx, &ev); err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored sealed:", seal.IsSealed(ev.Payload), "with key", seal.KeyID(ev.Payload))
	if err := sealer.Open(ctx, &ev); err != nil {
		log.Fatal(err)
	}
	fmt.Println("published:", string(ev.Payload))
	// Output:
	// stored sealed: true with key 2026-12
	// published: {"email":"ada@example.com"}
}
