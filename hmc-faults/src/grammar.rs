//! [`GRAMMAR`]: what a fault spec may say, in the words every parse error prints.

/// The grammar of a fault spec, as every parse error prints it.
pub const GRAMMAR: &str = "\
fault spec grammar (items separated by `;`, spaces ignored, each key at most once):
  SPEC     := ITEM { ';' ITEM }        ITEM := KEY '=' VALUE
  WHEN     := PROB | 'first:' COUNT | 'after:' COUNT
              (PROB: 0..1 or N%, drawn from the seed; first:N: the first N times;
               after:N: every time after the first N)
  DURATION := INTEGER ('us' | 'ms' | 's')      COUNT := INTEGER
  FRACTION := a number strictly between 0 and 1, or N% (share of a batch's bytes)
  keys (side where the fault acts):
    seed=COUNT                      the decisions' seed (default 0)
    connect.refuse=WHEN             initiator: connect fails as refused
    connect.delay=DURATION[@WHEN]   initiator: connect waits first
    xfer.stall=DURATION[@WHEN]      initiator: transfer waits first (its deadline still ends it)
    xfer.fail=WHEN                  initiator: transfer fails, no byte moved
    xfer.cut=FRACTION[@WHEN]        initiator: transfer moves that share of its bytes, then fails
    disconnect.after=COUNT          initiator: an endpoint's operations after COUNT fail, peer lost
    restart.after=COUNT             initiator: after COUNT operations on an endpoint the peer
                                    restarts: the endpoint and its imported keys are gone
    notify.drop=WHEN                notify.at's side: a notification is lost
    notify.delay=DURATION[@WHEN]    notify.at's side: a notification is late
    notify.dup=WHEN                 notify.at's side: a notification arrives twice
    notify.at=sender|receiver       where the notify.* faults act (default sender)
    meta.slow=DURATION[@WHEN]       initiator: a metadata lookup is slow
    meta.gone=WHEN                  initiator: a metadata lookup finds the service gone
    register.slow=DURATION[@WHEN]   local: a memory registration is slow
  example: seed=7;connect.refuse=first:1;xfer.stall=200ms@0.1;xfer.cut=0.5@5%;disconnect.after=100";
