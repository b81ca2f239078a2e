package natscluster_test

// Throughput of the operations broker mode is built from, on the embedded
// single node (file storage) and on the three-node cluster (R3, file
// storage):
//
//	go test -run '^$' -bench . -benchtime 1x ./internal/natscluster/
//
// Each operation is 20,000 messages of 1 KiB; msgs/s is the figure to
// read.

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/natscluster"
	"github.com/txhook/txhook/internal/natstest"
)

const benchMsgs = 20000

var benchPayload = make([]byte, 1024)

// benchBrokers runs f on the embedded server and on the cluster, each
// with a work-queue stream "B" on b.> of the broker's replica count.
func benchBrokers(b *testing.B, f func(b *testing.B, js jetstream.JetStream, st jetstream.Stream)) {
	for _, name := range []string{"embedded", "cluster"} {
		b.Run(name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			var nc *nats.Conn
			replicas := 1
			var c *natscluster.Cluster
			if name == "embedded" {
				nc = natstest.Start(b, natstest.Options{}).Connect(b)
			} else {
				c = natscluster.ForTest(b, natscluster.Options{})
				nc = c.Connect(b)
				replicas = 3
			}
			js, err := jetstream.New(nc)
			if err != nil {
				b.Fatal(err)
			}
			st, err := js.CreateStream(ctx, jetstream.StreamConfig{
				Name: "B", Subjects: []string{"b.>"}, Retention: jetstream.WorkQueuePolicy,
				Storage: jetstream.FileStorage, Replicas: replicas, Duplicates: time.Minute,
			})
			if err != nil {
				b.Fatal(err)
			}
			if c != nil {
				if _, err := c.WaitStream(ctx, "B"); err != nil {
					b.Fatal(err)
				}
			}
			f(b, js, st)
		})
	}
}

// publishAll publishes benchMsgs messages with PublishAsync, each with its
// own Nats-Msg-Id, and waits for every PubAck. With 4,000 publishes
// pending (nats.go's default window), PublishAsync waits for one to
// complete for at most its stall wait, 200ms by default, and then fails
// with jetstream.ErrTooManyStalledMsgs; a loaded cluster takes longer
// than that now and then, so the wait here is a minute.
func publishAll(b *testing.B, js jetstream.JetStream, round int) {
	b.Helper()
	for i := range benchMsgs {
		id := strconv.Itoa(round) + "-" + strconv.Itoa(i)
		if _, err := js.PublishAsync("b."+strconv.Itoa(i%64), benchPayload,
			jetstream.WithMsgID(id), jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d publishes still pending", js.PublishAsyncPending())
	}
}

// BenchmarkPublishAsync: async publishes with Nats-Msg-Id, waiting for all
// PubAcks (nats.go's default window of 4,000 pending).
func BenchmarkPublishAsync(b *testing.B) {
	benchBrokers(b, func(b *testing.B, js jetstream.JetStream, st jetstream.Stream) {
		ctx := context.Background()
		b.SetBytes(benchMsgs * int64(len(benchPayload)))
		b.ResetTimer()
		for round := range b.N {
			publishAll(b, js, round)
			b.StopTimer()
			if err := st.Purge(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(benchMsgs*b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}

// BenchmarkFetchAck: a durable pull consumer fetching batches of 500 and
// acknowledging each message, with Ack (fire and forget; the round ends
// when the consumer reports nothing pending), DoubleAck one message after
// the other (one round trip each), or DoubleAck from 32 goroutines at once
// (as concurrent delivery workers would).
func BenchmarkFetchAck(b *testing.B) {
	for _, mode := range []struct {
		name    string
		double  bool
		workers int
	}{{"Ack", false, 1}, {"DoubleAck", true, 1}, {"DoubleAck32", true, 32}} {
		double, workers := mode.double, mode.workers
		b.Run(mode.name, func(b *testing.B) {
			benchBrokers(b, func(b *testing.B, js jetstream.JetStream, st jetstream.Stream) {
				ctx := context.Background()
				cons, err := js.CreateOrUpdateConsumer(ctx, "B", jetstream.ConsumerConfig{
					Durable: "w", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxAckPending: 10000,
				})
				if err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for round := range b.N {
					b.StopTimer()
					publishAll(b, js, round)
					b.StartTimer()
					for n := 0; n < benchMsgs; {
						batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
						if err != nil {
							b.Fatal(err)
						}
						msgs := make(chan jetstream.Msg)
						errs := make(chan error, workers)
						for range workers {
							go func() {
								var err error
								for m := range msgs {
									if err != nil {
										continue
									}
									if double {
										err = m.DoubleAck(ctx)
									} else {
										err = m.Ack()
									}
								}
								errs <- err
							}()
						}
						for m := range batch.Messages() {
							msgs <- m
							n++
						}
						close(msgs)
						for range workers {
							if err := <-errs; err != nil {
								b.Fatal(err)
							}
						}
						if err := batch.Error(); err != nil {
							b.Fatal(err)
						}
					}
					for {
						ci, err := cons.Info(ctx)
						if err != nil {
							b.Fatal(err)
						}
						if ci.NumAckPending == 0 && ci.NumPending == 0 {
							break
						}
					}
				}
				b.ReportMetric(float64(benchMsgs*b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
		})
	}
}
