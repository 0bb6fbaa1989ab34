/* cowproxy's fast relay: an epoll thread in C that relays untagged connections without Python.
 *
 * Python (proxy/server.py) decides when a connection may go fast, pauses reading on both of its uvloop
 * transports and hands the two socket descriptors to an Engine (one per ProxyServer). The engine's thread
 * relays whole simple Query messages and extended-protocol messages (Parse, Bind, Describe, Execute, Close,
 * Sync, Flush) client -> server where Python's relay would forward them unchanged for an untagged connection
 * (and CopyData/CopyDone/CopyFail while a COPY FROM STDIN runs), keeping ReplyQueue.pending and
 * Prepared.statements/portals as Python does, and server -> client chunks as read, following only message
 * headers. It never touches a Python object: no GIL in the loop. When it meets what Python must decide (any
 * other client message, a Query or Parse with a comment that may carry tags, EOF, an error, a recall) it
 * removes the descriptors from its epoll set at a point where Python's relay state is exactly known (Python
 * recreates the replies still owed from the queue) and queues a hand-back; an eventfd
 * tells the asyncio loop, which calls take_handbacks(). The descriptors stay owned by the transports: the
 * engine never closes them. A session's Query with no decision is asked instead (a request: C holds it and
 * stops reading the client, wakes the loop the same way, and Python answers with the decision to take it by
 * or "hand back": take_requests(), answer()).
 *
 * Read traces: for a connection whose session's reads are recorded, Python marks the statements (and decided
 * texts) whose Executes (or Queries) are reads; C keeps a compact record of each (which statement, the rows
 * of its CommandComplete "SELECT n", times, the Bind's parameters, a Query's own text when its shape's
 * decision took it) in a bounded ring per connection, and Python takes the finished ones in batches
 * (take_reads, and with the hand-back). take_reads gives each connection's as one run of cow.read_runs (each
 * distinct statement once, each read a small entry naming it: proxy/reads.py's DICT_RUN), made here from the
 * heads Python gave at adoption. A full ring drops the
 * record and counts it: the relay never waits for recording.
 *
 * Copyright the cowproxy authors. License: GPL-3.0-or-later.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* What proxy/fastrelay.py expects (API_VERSION there): bump both when the module's functions or the tuples
 * they take or return change, so that a stale build (an editable install not rebuilt after a pull) is
 * reported and left unused instead of failing at the first call. */
#define API_VERSION 16
/* read_trace.XACT_STATEMENT and XACT_SQL: asked before the end of a transaction whose reads' operation is its. */
#define XACT_NAME "__cowproxy_xact"
#define XACT_SQL "SELECT pg_current_xact_id_if_assigned()"
#define XACT_ENTRIES 6 /* Close S, Parse, Bind, Execute, Close P, Close S (InjectedBatches.queue_query's shape) */
#define BUF_CAP (64 * 1024 + 5) /* a whole Query of up to 64 KiB with its header; larger ones go to Python */
#define MAX_INFLIGHT 128        /* pipelined queries in flight before the client stops being read */
#define QCAP 1024               /* replies owed (ReplyQueue.pending); a full queue hands the connection back */
#define MAX_NAMES 4096          /* prepared statements or portals tracked; more hands the connection back */
#define MAX_WORDS 64
#define MAX_KINDS 32
#define MAX_BUCKETS 32
#define MAX_ERROR_CLASSES 128
#define EBUF 256 /* the part of an ErrorResponse body searched for its SQLSTATE */
/* (table, kind) pairs counted for tagged connections' writes: a writing text whose pair has no slot is Python's
 * (Django's full list writes 1,019 pairs: 256 sent 1,595 of its requests back to Python). */
#define MAX_WRITE_SLOTS 4096
#define STMT_WRITES 4       /* writes of one statement counted here (Python binds one with more) */
#define MAX_DECISIONS 1024  /* cached decisions per connection */
/* Decisions Python answered during one stay (conn_t.extra, a table of the connection's own): a full one starts
 * again empty (its texts are asked again). */
#define MAX_ANSWERED 512
/* Read records per connection waiting for Python (a full ring drops), and those that make the thread wake
 * Python to take them. Python takes them once a second anyway; each take costs its thread ~0.2 ms whatever
 * its size (the wake-up, the lock, the writer's wake-up), which at a mark of 256 was ~0.3 µs per read at
 * -S's rates: a mark of 1,024 wakes it a quarter as often (docs/benchmarks.md, "Read traces: the identity
 * off the proxy, fewer takes"). 4,096 slots of 144 bytes: 590 KB per recorded connection. */
#define READ_CAP 4096
#define READ_MARK 1024
/* ParameterStatus messages kept per stay (the last of each name): a reused server connection's next client is
 * told the backend's values (proxy/pool.py, Greeting.reported). PostgreSQL reports some 15 settings; a longer
 * total (a search_path of kilobytes) is not kept, and the connection is then not reused. */
#define PST_MAX (16 * 1024)
#define PARAMS_INLINE 40    /* a read's Bind parameters up to this many bytes are kept in its record */
#define NO_READ LONG_MIN    /* a statement whose Executes are not recorded */
/* proxy/unnamed.py's PROMOTED_PREFIX: the named statements the proxy prepares for a session's unnamed reads. */
#define PROMOTED_PREFIX "__cowproxy_unnamed_"
#define MAX_PROMOS 2048 /* promotions given at adoption (Python: 64 names and MAX_DECISIONS texts at most) */

enum { CLIENT = 0, SERVER = 1 };

typedef struct conn conn_t;

/* A prepared statement as Python's Prepared.statements sees it: prepared here (text kept, for Python to analyse
 * at hand-back) or known to Python at adoption (idx into the list Python gave). Shared with the portals
 * bound from it, as Python shares its Statement objects. */
typedef struct stmt {
    int refs;
    int kind;
    int pyonly; /* Python must bind it (comment tags, or a kind C does not count) */
    long idx;   /* >= 0: Python's object; -1: text below */
    long read;  /* NO_READ, or what a read record names: >= 0 Python's object, < 0 -(decision index + 1) */
    int rerun;  /* watched when it starts an implicit transaction (see starts_transaction) */
    /* The unnamed statement standing for one of the proxy's (Promotions.alias): its name's number (0: none)
     * and its promotion (an index into conn_t.promos, or -1). */
    int alias, promo;
    unsigned char nslots; /* its writes (tagged connections): indexes into Engine.writes */
    unsigned short slots[STMT_WRITES];
    size_t len;
    unsigned char text[];
} stmt_t;

typedef struct {
    unsigned char *name;
    size_t len;
    stmt_t *s;
    unsigned char *params; /* a portal of a recorded read: its Bind after the portal's name (NULL: none) */
    size_t plen;
} named_t;

typedef struct {
    named_t *v;
    int n, cap;
} table_t;

/* A decision Python made for one statement text of a tagged connection (Decisions): forward it as is,
 * counted as kind with these writes, or (a 'Q' text's only) send Python's rewritten text in its place. Keyed by
 * the message type ('Q' or 'P') and the text, or by the lower-case type ('q' or 'p') and the text's shape:
 * every text of that shape (see shape_key). */
typedef struct {
    uint64_t hash;
    unsigned char *key; /* NULL: an empty slot */
    size_t len;
    /* The rewritten text (in key's allocation, after the key), or NULL: the text goes as it is. */
    unsigned char *sql;
    size_t sql_len;
    int kind;
    long read; /* NO_READ, or -(its index in Python's list + 1) */
    int rerun; /* as stmt_t.rerun */
    int promo; /* a 'U' decision (an unnamed Parse Python promotes): its index in conn_t.promos, else -1 */
    unsigned char nslots;
    unsigned short slots[STMT_WRITES];
} decision_t;

/* A rewritten read that an unnamed Parse of a session runs as (Promotions.promoted): the rewritten text and
 * the client's parameter types (count and OIDs, as in its Parse), the number of the proxy's name for it. */
enum { PROMO_NONE, PROMO_PARSING, PROMO_PREPARED };
typedef struct {
    unsigned char *sql;
    size_t sql_len;
    unsigned char *types;
    size_t types_len;
    int no;    /* __cowproxy_unnamed_<no> (0: none yet) */
    int state; /* PROMO_PREPARED: the server has it; PROMO_PARSING: its Parse is owed a reply */
} promo_t;

/* Read-only once loaded: shared by the connections adopted with the same list of decisions (Engine.dec_items)
 * and freed by the last one (refs; connections are freed on either thread). A list that extends the last one
 * loaded (Python's table only grows between its generations' turns) is loaded as its new entries on top of
 * that one's table (base), up to MAX_CHAIN tables deep. */
#define MAX_CHAIN 8
typedef struct dtable {
    decision_t *v;
    size_t cap; /* a power of two, at least twice the entries */
    int shapes; /* entries keyed by a shape ('q', 'p': proxy/sql/shapes.py), with the base's */
    int promos; /* 'U' entries (their promotion indexes are the connection's: never shared) */
    int refs;
    struct dtable *base; /* the table of the list's first entries, or NULL */
    int depth;           /* tables below this one */
} dtable_t;

static dtable_t NO_DECISIONS = {.refs = 1}; /* (never freed) */

/* What a forwarded client message will be answered with (ReplyQueue.pending; the kind letters of Kind). */
typedef struct {
    char kind; /* Q S P B D E C */
    char inj;  /* the proxy's own (the transaction id asked): its replies never reach the client */
    /* Sent rewritten (Entry.rewritten): 1 for a promotion (its replies are owed before a hand-back), 2 for a
     * Query sent as its decision's rewritten text (handed back as 'q': Python's entry is rewritten too). */
    char rw;
    short promo; /* a promotion's Parse, or a Bind or Describe of its name: its index + 1 (0: none) */
    int no;      /* the name's number it was sent with */
    int dealloc; /* a promotion's Parse: conn_t.dealloc when sent (one pipelined after it forgets it) */
    double started;
    long long rec; /* the read record this Query or Execute finishes (a sequence number), or -1 */
} entry_t;

/* A read of a recorded session (ReadTrace.pending_read and read_done): done when its CommandComplete came. */
typedef struct {
    long ref; /* as stmt_t.read */
    int state; /* 0: in flight, 1: done, 2: failed or no CommandComplete (nothing to record) */
    int pinned; /* the Bind's parameters are in pin (params NULL) */
    long long rows; /* of "SELECT n", or -1 */
    double started; /* monotonic at the Execute or Query */
    /* At its CommandComplete: monotonic while in the ring, the wall clock once taken (take_ring, handback_reads
     * add the clocks' difference, read once per take: one clock read less per read on the relay's path). */
    double wall;
    long long txn;        /* its transaction: conn_t.txn at its CommandComplete */
    unsigned long long xid; /* its transaction's id, once that ended (0: none, a read-only transaction) */
    long long duration_us;
    unsigned char *params; /* the Bind's, or NULL (none, or pinned) */
    size_t plen;
    unsigned char *text; /* a Query taken by its shape's decision: its own text (the record's statement), or NULL */
    size_t tlen;
    /* Short parameters (pgbench's, most keys) are kept here: no malloc on the relay's thread and free on
     * Python's per read (records are copied out of the ring by value, so no pointer into it). */
    unsigned char pin[PARAMS_INLINE];
} rec_t;

static const unsigned char *rec_params(const rec_t *rec) { return rec->pinned ? rec->pin : rec->params; }

static void rec_free(rec_t *rec) {
    free(rec->params);
    free(rec->text);
    rec->params = rec->text = NULL;
    rec->pinned = 0;
}

typedef struct {
    rec_t *v;           /* READ_CAP slots, allocated at adoption of a recorded connection */
    long long base, end; /* sequence numbers: v[seq % READ_CAP] for base <= seq < end */
    int marked;          /* past READ_MARK, the loop woken: not again until taken */
} ring_t;

/* ---- read records as runs of cow.read_runs (tests decode them into proxy/reads.py's encode_rows) ---- */

/* What Python gives for a read a record names: the row's first columns as bytes (the field count,
 * fingerprint, relations, statement: proxy/reads.py's _CopyShape.head). */
typedef struct {
    unsigned char *head; /* NULL: none given (its records go to Python as tuples) */
    size_t len;
    int shape; /* a shape's decision: the head ends before the statement, which is each record's own text */
} rhead_t;

/* A recorded connection's encoder (adopt's ``encode``): its session's and operation's fields and the heads of
 * its reads by ref. Shared by the connection and a take in progress (refs), freed by the last one. */
typedef struct {
    int refs;
    unsigned char *session; /* the COPY field (length + text) */
    size_t slen;
    unsigned char *operation; /* the COPY field of the operation id in force, or NULL: the transaction's */
    size_t olen;
    unsigned char *read_ids; /* TxnReads.read_ids: read-only transactions are "<read_ids>.<n>" */
    size_t rlen;
    rhead_t *stmts, *decs; /* by ref >= 0, and by -(ref + 1) */
    long nstmts, ndecs;
} enc_t;

static void enc_unref(enc_t *en) {
    if (en == NULL || __atomic_sub_fetch(&en->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    for (long i = 0; i < en->nstmts; i++) free(en->stmts[i].head);
    for (long i = 0; i < en->ndecs; i++) free(en->decs[i].head);
    free(en->stmts);
    free(en->decs);
    free(en->session);
    free(en->operation);
    free(en->read_ids);
    free(en);
}

static enc_t *enc_ref(enc_t *en) {
    if (en != NULL) __atomic_add_fetch(&en->refs, 1, __ATOMIC_ACQ_REL);
    return en;
}

/* The head of a done record's row, or NULL: its record goes to Python as a tuple. */
static const rhead_t *rec_head(const enc_t *en, const rec_t *rec) {
    const rhead_t *h = NULL;
    long ref = rec->ref;
    if (en == NULL || rec->state != 1) return NULL;
    if (ref >= 0 && ref < en->nstmts) h = &en->stmts[ref];
    else if (ref < 0 && -(ref + 1) < en->ndecs) h = &en->decs[-(ref + 1)];
    return h != NULL && h->head != NULL && h->shape == (rec->text != NULL) ? h : NULL;
}

/* A record's head's place among the encoder's (its statement's, then the decisions'), for one that has a head. */
static long head_slot(const enc_t *en, const rec_t *rec) {
    return rec->ref >= 0 ? rec->ref : en->nstmts - (rec->ref + 1);
}

static const rhead_t *slot_head(const enc_t *en, long slot) {
    return slot < en->nstmts ? &en->stmts[slot] : &en->decs[slot - en->nstmts];
}

#define MAX_TEXT 4000 /* characters of a statement's text kept (proxy/reads.py MAX_TEXT) */
#define PG_EPOCH 946684800.0 /* 2000-01-01 in Unix time: timestamptz counts µs from there */
#define MAX_OP_FIELD 64      /* "xact:" and a 20-digit id, or read_ids (< 32) "." and a 20-digit number, with 4 */

/* Big-endian, as COPY's binary format and the runs have them (a byte swap and a store: a run writes several
 * per read). */
static unsigned char *put32(unsigned char *p, int32_t v) {
    uint32_t u = __builtin_bswap32((uint32_t)v);
    memcpy(p, &u, 4);
    return p + 4;
}

static unsigned char *put64(unsigned char *p, int64_t v) {
    uint64_t u = __builtin_bswap64((uint64_t)v);
    memcpy(p, &u, 8);
    return p + 8;
}

/* v in decimal at out (at most 20 digits): how many. */
static int put_decimal(unsigned char *out, unsigned long long v) {
    unsigned char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (unsigned char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    for (int i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
    return n;
}

static unsigned char *put_field(unsigned char *p, const unsigned char *text, size_t n) {
    p = put32(p, (int32_t)n);
    memcpy(p, text, n);
    return p + n;
}

static size_t space_len(const unsigned char *s, size_t n);
static size_t skip_spaces(const unsigned char *s, size_t pos, size_t n);

/* The statement a record's own text stands for: Python's sql.strip()[:MAX_TEXT] (a text C takes has no
 * comment for strip_edge_comments to remove): its start in *start, its length returned. */
static size_t statement_text(const unsigned char *s, size_t n, size_t *start) {
    size_t a = skip_spaces(s, 0, n), b = n;
    while (b > a) { /* (the last character: back over UTF-8 continuation bytes) */
        size_t k = b - 1;
        while (k > a && (s[k] & 0xc0) == 0x80 && b - k < 4) k--;
        if (space_len(s + k, b - k) != b - k) break;
        b = k;
    }
    size_t i = a, chars = 0;
    for (; i < b; i++)
        if ((s[i] & 0xc0) != 0x80 && chars++ == MAX_TEXT) break;
    *start = a;
    return i - a;
}

/* ---- a take's records as one dictionary run (proxy/reads.py, DICT_RUN; decoded by cow._run_reads) ----
 * A take is one connection's reads, which mostly repeat a few statements: each distinct statement (its head:
 * fingerprint, tables, text) is written once, and each read as a small entry naming it, instead of a COPY row
 * per read that repeated every field (30-38 bytes a read besides its parameters instead of ~185 at -S: fewer
 * bytes built here, sent, compressed and written by the server). The identity is not hashed here: readers
 * derive it from the statement and the parameters (migration 52). */
#define RUN_MARK (-2)     /* the run's first int16: a COPY row's field count (9) starts an older run */
#define OP_SAME (-2)      /* an entry's operation: the previous entry's (-1 is NULL, which C never writes) */
#define OP_READONLY (-3)  /* read_ids "." and the int8 that follows (a read-only transaction's number) */
#define ENTRY_FIXED 30    /* an entry's bytes besides its operation, parameters and own text */

static unsigned char *put16(unsigned char *p, int v) {
    p[0] = (unsigned char)((unsigned)v >> 8), p[1] = (unsigned char)v;
    return p + 2;
}

/* The statement field a head ends with, or NULL when its reads bring their own (a shape's decision). Python's
 * head starts with the COPY row's field count (2 bytes), which a run's statement leaves out. */
static unsigned char *put_statement(unsigned char *p, const rhead_t *h) {
    memcpy(p, h->head + 2, h->len - 2);
    p += h->len - 2;
    return h->shape ? put32(p, -1) : p;
}

/* One record's entry: its statement's index, operation (OP_SAME when it is the previous entry's, whose kind
 * and value *last_kind and *last hold: 0 none yet, 1 the operation id in force, 2 an xact id, 3 a read-only
 * transaction's number), at, parameters, rows, duration_us, and its own text for a shape's decision. */
static unsigned char *put_entry(const enc_t *en, const rhead_t *h, int index, const rec_t *rec, int *last_kind,
                                unsigned long long *last, unsigned char *p) {
    int kind = en->operation != NULL ? 1 : rec->xid ? 2 : 3;
    unsigned long long value = kind == 1 ? 0 : kind == 2 ? rec->xid : (unsigned long long)rec->txn;
    p = put16(p, index);
    if (kind == *last_kind && value == *last) {
        p = put32(p, OP_SAME);
    } else if (kind == 1) {
        memcpy(p, en->operation, en->olen);
        p += en->olen;
    } else if (kind == 2) { /* "xact:<id>" */
        unsigned char digits[20];
        int n = put_decimal(digits, rec->xid);
        p = put32(p, 5 + n);
        memcpy(p, "xact:", 5);
        memcpy(p + 5, digits, (size_t)n);
        p += 5 + n;
    } else {
        p = put32(p, OP_READONLY);
        p = put64(p, rec->txn);
    }
    *last_kind = kind, *last = value;
    p = put64(p, (int64_t)((rec->wall - PG_EPOCH) * 1e6) - rec->duration_us);
    p = rec_params(rec) != NULL ? put_field(p, rec_params(rec), rec->plen) : put32(p, -1);
    p = put64(p, rec->rows >= 0 ? rec->rows : -1);
    p = put64(p, rec->duration_us);
    if (h->shape) {
        size_t start, n = statement_text(rec->text, rec->tlen, &start);
        p = put_field(p, rec->text + start, n);
    }
    return p;
}

typedef struct {
    conn_t *c;
    int side;
} end_t;

typedef struct {
    unsigned char *buf;
    size_t off, len, cap;
} outbuf_t;

struct conn {
    long long id;
    int fd[2];
    uint32_t mask[2];
    end_t end[2];
    uint64_t max_message;
    char status; /* of the last ReadyForQuery */
    int inflight; /* entries in q that end with ReadyForQuery (Query, Sync) */
    entry_t q[QCAP];
    int head, qlen;
    int copy_in;
    int mid_batch;       /* ReplyQueue.mid_batch */
    int skip;            /* ReplyQueue.skip_until_sync */
    double batch_started;
    /* The monotonic clock of the bytes being parsed, read at most once per recv (0: not read yet): the
     * messages of one recv arrived together, so the times taken while parsing them share one clock read
     * (tick): on the client's side a batch's start and a read's, on the server's a read's end and the
     * reply's latency. A recorded read added two clock reads on this thread; now none. */
    double tick;
    table_t stmts, portals;
    int tagged;      /* in a session (startup tags): only texts with a decision are taken */
    ring_t reads;    /* its reads, when its session's reads are recorded */
    enc_t *enc;      /* and how they become a run (NULL: Python makes them) */
    /* Reads with no operation id take their transaction's (ReadTrace.txn, TxnReads): resolve is the kind index
     * of transaction statements (-1: an operation id is in force, nothing to resolve). txn counts the
     * ReadyForQuery with status I; txn_reads and txn_wrote, what was sent since the connection was last
     * idle: such a transaction's end (a transaction statement, a Sync with status I) is handed back, for
     * Python to ask the server its transaction id first. */
    int resolve;
    long long txn;
    int txn_reads, txn_wrote;
    /* The question (XACT_SQL) before that end, asked here as ReadTrace.ask_xact does: ask is set by the
     * message it goes before (parse_client then sends it and takes that message again: asked); inj_owed
     * counts its replies still owed (no hand-back until they are in); the answer, for the open transaction. */
    int ask, asked, inj_owed, inj_flushed;
    unsigned long long txn_xid;
    int sdrop; /* the server message being read is a reply to the question: not relayed */
    long long cur_rec; /* the record whose CommandComplete body is being read, or -1 */
    dtable_t *dec;   /* Decisions, given at adoption (NO_DECISIONS: none) */
    /* A Query of a session with no decision is asked of Python (may_ask: it may be; asking: the request's number
     * while its answer is awaited, the client not read meanwhile and the Query first in cin) instead of
     * handing the connection back; the decisions answered during the stay (NULL: none yet); answered: the
     * next Query taken is the one asked about (Python counted its analysis, not C). */
    int may_ask;
    unsigned long long asking;
    dtable_t *extra;
    int answered;
    /* Promotions (proxy/unnamed.py), given at adoption and handed back: names made so far and how many may be;
     * texts that may have deallocated them (Promotions._deallocations, counted here from 0); replies owed to
     * messages sent for them; a rewritten one that failed as on a stale catalog (CatalogGate.suspect: Python
     * checks the catalog before the next, so C takes no more). */
    promo_t *promos;
    int npromos, promo_count, promo_max, dealloc, promo_owed, suspect;
    /* A client message C sends in another form (a promotion's Parse, a Bind or Describe renamed): the bytes
     * sent in its place, and the length of the client's (0: none waiting). */
    unsigned char *repl;
    size_t repl_len, repl_cap, repl_skip;
    /* A statement Python may run again (stmt_t.rerun) that starts an implicit transaction: its Query or batch as
     * sent (watch 1 while the batch comes, 2 from its Query or Sync until a reply shows its outcome, the client
     * not read meanwhile). An ErrorResponse or NoticeResponse before such a reply hands the connection back
     * before that message, with the batch and the server bytes not forwarded (sheld): Python holds them and
     * runs the statement again after the layer's row-changed 40001 (proxy/rerun.py). */
    int watch;
    unsigned char *wbuf;
    size_t wlen;
    unsigned char *sheld;
    size_t sheld_len;
    unsigned long taken; /* client messages taken since adoption */
    /* client side */
    unsigned char *cin; /* bytes read from the client, not forwarded (a partial or untaken message) */
    size_t cin_len;
    uint64_t cstream_left; /* body bytes of a CopyData still to pass through */
    int stop_client;       /* a message C does not take is next */
    int untaken;           /* its type byte */
    int recall;
    /* server side */
    unsigned char shdr[5];
    int shdr_have;
    uint64_t sbody_left;
    unsigned char stype;
    unsigned char ebuf[EBUF];
    int ebuf_have;
    /* The ParameterStatus messages the server sent during the stay, whole, the last of each name only; pst_at:
     * where the one being read starts (pst_keep: it is being kept); pst_lost: one was not kept. */
    unsigned char *pst;
    size_t pst_len, pst_cap, pst_at;
    int pst_keep, pst_lost;
    outbuf_t out[2]; /* out[CLIENT]: not yet written to the client; out[SERVER]: to the server */
    int dead;
    conn_t *next;
};

typedef struct handback {
    long long id;
    const char *reason;
    int err;
    char status;
    int inflight;
    int untaken;
    unsigned char *data;
    size_t len;
    char kinds[QCAP + 1];
    int mid_batch, skip;
    table_t stmts, portals;
    unsigned long taken;
    ring_t reads; /* moved from the connection: the done ones and those the owed replies will finish */
    enc_t *enc;   /* the connection's encoder (a reference), or NULL: its done records as a run too */
    long long *qrec; /* per owed reply: its record, or -1 (NULL: none) */
    long long txn;
    int txn_reads, txn_wrote;
    unsigned long long txn_xid;
    unsigned char *batch; /* a watched statement's Query or batch (NULL: none), and the server bytes after */
    size_t blen;
    unsigned char *sdata;
    size_t slen;
    promo_t *promos; /* moved from the connection */
    int npromos, promo_count, dealloc, suspect;
    unsigned char *pst; /* moved from the connection: its ParameterStatus messages */
    size_t pst_len;
    int pst_lost;
    struct handback *next;
} handback_t;

/* A Query of a session C has no decision for, asked of Python (conn_t.asking): its text (without the NUL). */
typedef struct request {
    long long id;
    unsigned long long seq;
    unsigned char *text;
    size_t len;
    struct request *next;
} request_t;

typedef struct {
    char word[16];
    int len;
    int kind;
} word_t;

typedef struct {
    PyObject_HEAD pthread_mutex_t mu;
    pthread_t thread;
    int started;
    int stop;
    int epfd, wakefd, notifyfd;
    conn_t *conns;
    conn_t *graveyard;
    handback_t *hb_head, *hb_tail;
    int notify;
    long nconns;
    unsigned char *scratch;
    unsigned char *shape; /* a text's shape key (BUF_CAP: no longer than the text) */
    /* statement kinds, from the Python table */
    word_t words[MAX_WORDS];
    int nwords, nkinds, kind_utility, kind_other;
    /* counters, merged into the metrics at scrape time */
    unsigned long long statements[MAX_KINDS];
    unsigned long long statements_tagged[MAX_KINDS];
    unsigned long long writes[MAX_WRITE_SLOTS];
    unsigned long long decision_hits; /* tagged texts taken by a decision (Python's analysis cache hits) */
    unsigned long long rewrites;      /* of those, sent rewritten: promotions' Parses, Queries (Metrics.rewrites) */
    unsigned long long shape_hits;    /* of those, taken by their shape's */
    unsigned long long reads_done, reads_dropped; /* read records made; dropped (a full ring) */
    unsigned long long reads_dropped_told;        /* of those, already reported by take_reads */
    unsigned long long bytes_up, bytes_down;
    char error_class[MAX_ERROR_CLASSES][2];
    unsigned long long error_count[MAX_ERROR_CLASSES];
    int nerror_classes;
    double bounds[MAX_BUCKETS];
    int nbounds;
    unsigned char xact[256]; /* the question's messages (ask_xact): 197 bytes */
    size_t xact_len;
    unsigned long long latency[MAX_BUCKETS + 1];
    double latency_sum;
    PyObject *dec_items;  /* the list of decisions last loaded without promotions, and its table */
    dtable_t *dec_table;
    /* Requests for a decision waiting for Python (take_requests), in order; the last request's number. */
    struct request *rq_head, *rq_tail;
    unsigned long long rq_seq;
} Engine;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double tick(conn_t *c) {
    if (c->tick == 0) c->tick = now();
    return c->tick;
}

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* ---- statement kind: proxy.analysis.quick_kind over the bytes of a valid UTF-8 text ---- */

static int is_alpha(unsigned char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }

/* Length of the whitespace character at s (Python's str.isspace, as re's \s), or 0. */
static size_t space_len(const unsigned char *s, size_t n) {
    unsigned char b = s[0];
    if ((b >= 0x09 && b <= 0x0d) || (b >= 0x1c && b <= 0x20)) return 1;
    if (b < 0x80) return 0;
    uint32_t cp;
    size_t len;
    if ((b & 0xe0) == 0xc0 && n >= 2) {
        cp = ((uint32_t)(b & 0x1f) << 6) | (s[1] & 0x3f);
        len = 2;
    } else if ((b & 0xf0) == 0xe0 && n >= 3) {
        cp = ((uint32_t)(b & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
        len = 3;
    } else {
        return 0;
    }
    if (cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
        cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000)
        return len;
    return 0;
}

static size_t skip_spaces(const unsigned char *s, size_t pos, size_t n) {
    size_t k;
    while (pos < n && (k = space_len(s + pos, n - pos)) > 0) pos += k;
    return pos;
}

static int lookup_word(Engine *e, const unsigned char *w, size_t len) {
    if (len < sizeof(e->words[0].word)) {
        char lower[16];
        for (size_t i = 0; i < len; i++) lower[i] = (char)(w[i] | 0x20);
        for (int i = 0; i < e->nwords; i++)
            if ((size_t)e->words[i].len == len && memcmp(e->words[i].word, lower, len) == 0)
                return e->words[i].kind;
    }
    return e->kind_utility;
}

static int text_kind(Engine *e, const unsigned char *s, size_t n) {
    size_t pos = 0, start;
    if (n && is_alpha(s[0])) {
        while (pos < n && is_alpha(s[pos])) pos++;
        return lookup_word(e, s, pos);
    }
    /* \s*(?:(?:--[^\n]*\n|/\*.*?\*\/)\s*)*\(*\s*([A-Za-z]+) -- no block comment reaches C */
    pos = skip_spaces(s, 0, n);
    while (pos + 1 < n && s[pos] == '-' && s[pos + 1] == '-') {
        const unsigned char *nl = memchr(s + pos, '\n', n - pos);
        if (nl == NULL) break;
        pos = skip_spaces(s, (size_t)(nl - s) + 1, n);
    }
    while (pos < n && s[pos] == '(') pos++;
    pos = skip_spaces(s, pos, n);
    start = pos;
    while (pos < n && is_alpha(s[pos])) pos++;
    if (pos == start) return e->kind_other;
    return lookup_word(e, s + start, pos - start);
}

/* ---- what Relay.fast_query takes: no comment opener anywhere, one NUL at the end, valid UTF-8 ---- */

static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((b & 0xe0) == 0xc0) {
            len = 2, cp = b & 0x1f, min = 0x80;
        } else if ((b & 0xf0) == 0xe0) {
            len = 3, cp = b & 0x0f, min = 0x800;
        } else if ((b & 0xf8) == 0xf0) {
            len = 4, cp = b & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += len;
    }
    return 1;
}

static int query_ok(const unsigned char *m, size_t total) {
    if (total < 6 || m[total - 1] != 0) return 0;
    if (memchr(m + 5, 0, total - 6) != NULL) return 0;
    for (size_t i = 0; i + 1 < total; i++) {
        const unsigned char *slash = memchr(m + i, '/', total - 1 - i);
        if (slash == NULL) break;
        if (slash[1] == '*') return 0;
        i = (size_t)(slash - m);
    }
    return valid_utf8(m + 5, total - 6);
}

/* ---- the extended protocol: what Relay._client_frame forwards unchanged for an untagged connection ---- */

/* A NUL-terminated UTF-8 string at body[pos..n) (protocol._cstring); returns the position after its NUL. */
static long cstring(const unsigned char *b, size_t pos, size_t n) {
    const unsigned char *z = pos < n ? memchr(b + pos, 0, n - pos) : NULL;
    if (z == NULL || !valid_utf8(b + pos, (size_t)(z - b) - pos)) return -1;
    return (long)(z - b) + 1;
}

static int has_comment_opener(const unsigned char *s, size_t n) {
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '/' && s[i + 1] == '*') return 1;
    return 0;
}

/* ---- literal-normalised keys: proxy/sql/shapes.py's lexer, byte for byte (see its docstring) ---- */

#define SHAPE_INT 0xff /* an integer the server lexes as one (ICONST) */
#define SHAPE_NUM 0xfe /* any other numeric literal */
#define SHAPE_STR 0xfd /* a plain string literal 'x' without a backslash */
#define MAX_DOLLAR_TAG 64 /* a longer dollar-quote delimiter: no key (shapes.MAX_DOLLAR_TAG) */
#define SHAPE_NAME 0xfc /* the name of a savepoint or cursor command (shapes.NAME) */

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int ident_start(unsigned char c) { return is_alpha(c) || c == '_' || c >= 0x80; }
static int ident_cont(unsigned char c) { return ident_start(c) || is_digit(c) || c == '$'; }
static int dollar_cont(unsigned char c) { return ident_start(c) || is_digit(c); }

/* The end of the run quoted by s[i] (a doubled quote stays inside), or 0: unterminated. With escapes, a
 * backslash takes the next byte (E'...'); *backslash tells whether one was inside. */
static size_t quoted_end(const unsigned char *s, size_t i, size_t n, int escapes, int *backslash) {
    unsigned char q = s[i];
    for (size_t j = i + 1; j < n; j++) {
        if (s[j] == '\\') {
            *backslash = 1;
            if (escapes) j++;
        } else if (s[j] == q) {
            if (j + 1 < n && s[j + 1] == q) j++;
            else return j + 1;
        }
    }
    return 0;
}

/* The end of the nested block comment opened at i, or 0: unterminated. */
static size_t comment_end(const unsigned char *s, size_t i, size_t n) {
    int depth = 0;
    for (size_t j = i + 2; j + 1 < n;) {
        if (s[j] == '/' && s[j + 1] == '*') {
            depth++;
            j += 2;
        } else if (s[j] == '*' && s[j + 1] == '/') {
            if (depth == 0) return j + 2;
            depth--;
            j += 2;
        } else {
            j++;
        }
    }
    return 0;
}

/* Whether a quote on a later line follows s[j..) across whitespace and -- comments only: the server continues
 * the string that ended at j there ('...'\n'...' is one constant, shapes._CONTINUED). */
static int continued(const unsigned char *s, size_t j, size_t n) {
    int newline = 0;
    while (j < n) {
        unsigned char c = s[j];
        if (c == '\n' || c == '\r') {
            newline = 1;
            j++;
        } else if (c == ' ' || c == '\t' || c == '\f' || c == '\v') {
            j++;
        } else if (c == '-' && j + 1 < n && s[j + 1] == '-') {
            while (j < n && s[j] != '\n' && s[j] != '\r') j++;
        } else {
            return newline && c == '\'';
        }
    }
    return 0;
}

/* The end of E'', B'', X'', N'', U&'' or U&"" when the one-letter identifier at i starts one, else i + 1;
 * 0: no key (unterminated, a backslash in a plain string, or continued on a later line). */
static size_t prefixed_end(const unsigned char *s, size_t i, size_t n) {
    unsigned char c = s[i] | 0x20;
    int backslash = 0;
    size_t end;
    if (i + 1 < n && s[i + 1] == '\'' && c == 'e') {
        end = quoted_end(s, i + 1, n, 1, &backslash);
    } else if (i + 1 < n && s[i + 1] == '\'' && (c == 'b' || c == 'x' || c == 'n')) {
        end = quoted_end(s, i + 1, n, 0, &backslash);
        if (backslash) return 0;
    } else if (c == 'u' && i + 2 < n && s[i + 1] == '&' && (s[i + 2] == '\'' || s[i + 2] == '"')) {
        end = quoted_end(s, i + 2, n, 0, &backslash);
    } else {
        return i + 1;
    }
    /* Continued on a later line, the string stays of its prefix's class for the server: no key. */
    return end != 0 && continued(s, end, n) ? 0 : end;
}

/* The class of the number at s[i..end); 0: kept verbatim (a dot after it); -1: no key (an identifier
 * character or $ after it: 0x1F, 1_000). */
static int number_class(const unsigned char *s, size_t i, size_t end, size_t n) {
    if (end < n && ident_cont(s[end])) return -1;
    if (end < n && s[end] == '.') return 0;
    size_t k = i;
    while (k < end && s[k] == '0') k++;
    uint64_t v = 0;
    for (size_t j = k; j < end; j++) {
        if (!is_digit(s[j])) return SHAPE_NUM;
        if (j - k >= 10) return SHAPE_NUM;
        v = v * 10 + (uint64_t)(s[j] - '0');
    }
    return v <= 2147483647u ? SHAPE_INT : SHAPE_NUM;
}

/* The end of the number starting at i (a digit, or a dot before one). */
static size_t number_end(const unsigned char *s, size_t i, size_t n) {
    size_t j = i;
    while (j < n && is_digit(s[j])) j++;
    if (j < n && s[j] == '.' && !(j + 1 < n && s[j + 1] == '.')) { /* (1..2: 1, "..", 2 as the server's) */
        j++;
        while (j < n && is_digit(s[j])) j++;
    }
    if (j < n && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < n && (s[k] == '+' || s[k] == '-')) k++;
        if (k < n && is_digit(s[k])) {
            while (k < n && is_digit(s[k])) k++;
            j = k;
        }
    }
    return j;
}

/* ---- savepoint commands: shapes._SAVEPOINT, byte for byte (the name is the key's one placeholder) ---- */

static int sp_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Skips the whitespace at *i; whether there was some. */
static int sp_skip(const unsigned char *s, size_t n, size_t *i) {
    size_t j = *i;
    while (j < n && sp_space(s[j])) j++;
    int some = j > *i;
    *i = j;
    return some;
}

/* Whether the keyword word (lower case) is at *i, any case, followed by whitespace when spaced (or else by
 * anything); then steps over it. */
static int sp_word(const unsigned char *s, size_t n, size_t *i, const char *word, int spaced) {
    size_t len = strlen(word), j = *i;
    if (n - j < len) return 0;
    for (size_t k = 0; k < len; k++)
        if ((s[j + k] | 0x20) != (unsigned char)word[k]) return 0;
    if (spaced && !(j + len < n && sp_space(s[j + len]))) return 0;
    *i = j + len;
    return 1;
}

/* The end of a savepoint's name at i: a quoted identifier (not empty) or an unquoted one with a digit (never
 * a keyword); 0: none. */
static size_t sp_name_end(const unsigned char *s, size_t n, size_t i) {
    if (i < n && s[i] == '"') {
        for (size_t j = i + 1; j < n; j++) {
            if (s[j] != '"') continue;
            if (j + 1 < n && s[j + 1] == '"') {
                j++;
                continue;
            }
            return j > i + 1 ? j + 1 : 0;
        }
        return 0;
    }
    if (i >= n || !ident_start(s[i])) return 0;
    size_t j = i + 1;
    int digit = 0;
    while (j < n && ident_cont(s[j])) digit |= is_digit(s[j++]);
    return digit ? j : 0;
}

/* The key of a savepoint command (SAVEPOINT n, RELEASE [SAVEPOINT] n, ROLLBACK [WORK|TRANSACTION] TO
 * [SAVEPOINT] n, as a whole text) written to out: its length, or -1 (not one). */
static long savepoint_key(const unsigned char *s, size_t n, unsigned char *out) {
    size_t i = 0;
    sp_skip(s, n, &i);
    if (sp_word(s, n, &i, "savepoint", 0)) {
    } else if (sp_word(s, n, &i, "release", 0)) {
        size_t j = i;
        if (sp_skip(s, n, &j) && sp_word(s, n, &j, "savepoint", 1)) i = j;
    } else if (sp_word(s, n, &i, "rollback", 0)) {
        size_t j = i;
        if (sp_skip(s, n, &j) && (sp_word(s, n, &j, "work", 1) || sp_word(s, n, &j, "transaction", 1))) i = j;
        if (!sp_skip(s, n, &i) || !sp_word(s, n, &i, "to", 0)) return -1;
        j = i;
        if (sp_skip(s, n, &j) && sp_word(s, n, &j, "savepoint", 1)) i = j;
    } else {
        return -1;
    }
    if (!sp_skip(s, n, &i)) return -1;
    size_t start = i, end = sp_name_end(s, n, i);
    if (end == 0) return -1;
    i = end;
    sp_skip(s, n, &i);
    if (i != n) return -1;
    memcpy(out, s, start);
    out[start] = SHAPE_NAME;
    memcpy(out + start + 1, s + end, n - end);
    return (long)(start + 1 + n - end);
}

/* ---- cursor commands: shapes._CURSOR and shapes._DECLARE, byte for byte (the name is a placeholder) ---- */

static int cursor_word(unsigned char c) { return is_alpha(c) || is_digit(c) || c == '+' || c == '-'; }

/* The end of a name at i that only whitespace follows to the end of the text; 0: none. */
static size_t last_name_end(const unsigned char *s, size_t n, size_t i) {
    size_t end = sp_name_end(s, n, i), j = end;
    if (end == 0) return 0;
    sp_skip(s, n, &j);
    return j == n ? end : 0;
}

/* The name of FETCH|MOVE [words] FROM|IN n or CLOSE n as a whole text (the words: directions and counts,
 * verbatim): its end, its start in *start; 0: not one. */
static size_t cursor_name(const unsigned char *s, size_t n, size_t *start) {
    size_t i = 0, end;
    sp_skip(s, n, &i);
    if (sp_word(s, n, &i, "close", 0)) {
        if (!sp_skip(s, n, &i) || (end = last_name_end(s, n, i)) == 0) return 0;
        *start = i;
        return end;
    }
    if (!sp_word(s, n, &i, "fetch", 0) && !sp_word(s, n, &i, "move", 0)) return 0;
    for (int from = 0;;) {
        if (!sp_skip(s, n, &i)) return 0;
        if (from && (end = last_name_end(s, n, i)) != 0) {
            *start = i;
            return end;
        }
        size_t j = i, w = i;
        while (j < n && cursor_word(s[j])) j++;
        if (j == i) return 0;
        from = (j - i == 4 && sp_word(s, n, &w, "from", 0)) || (j - i == 2 && sp_word(s, n, &w, "in", 0));
        i = j;
    }
}

/* The end of the name of DECLARE n at the start of the text (whitespace after it), its start in *start; 0:
 * none. */
static size_t declare_name(const unsigned char *s, size_t n, size_t *start) {
    size_t i = 0, end;
    sp_skip(s, n, &i);
    if (!sp_word(s, n, &i, "declare", 0) || !sp_skip(s, n, &i)) return 0;
    end = sp_name_end(s, n, i);
    if (end == 0 || end >= n || !sp_space(s[end])) return 0;
    *start = i;
    return end;
}

/* The key of s[0..n) written to out (room for n bytes); its length, or -1: no key (no literal, or a text the
 * lexer does not follow: an unterminated quote or comment, a backslash in a plain string). */
static long shape_key(const unsigned char *s, size_t n, unsigned char *out) {
    size_t i = 0, o = 0, end, start;
    int literals = 0;
    long named = savepoint_key(s, n, out);
    if (named >= 0) return named;
    if ((end = cursor_name(s, n, &start)) != 0) {
        memcpy(out, s, start);
        out[start] = SHAPE_NAME;
        memcpy(out + start + 1, s + end, n - end);
        return (long)(start + 1 + n - end);
    }
    if ((end = declare_name(s, n, &start)) != 0) { /* the name, then the query as any text */
        memcpy(out, s, start);
        out[start] = SHAPE_NAME;
        o = start + 1;
        i = end;
        literals = 1;
    }
    while (i < n) {
        unsigned char c = s[i];
        int cls = 0;
        if (c == '-' && i + 1 < n && s[i + 1] == '-') {
            end = i + 2;
            while (end < n && s[end] != '\n' && s[end] != '\r') end++;
        } else if (c == '/' && i + 1 < n && s[i + 1] == '*') {
            if ((end = comment_end(s, i, n)) == 0) return -1;
        } else if (ident_start(c)) {
            end = i + 1;
            while (end < n && ident_cont(s[end])) end++;
            if (end == i + 1 && (end = prefixed_end(s, i, n)) == 0) return -1;
        } else if (c == '.' && i + 1 < n && s[i + 1] == '.') {
            end = i + 2;
        } else if (is_digit(c) || (c == '.' && i + 1 < n && is_digit(s[i + 1]))) {
            end = number_end(s, i, n);
            if ((cls = number_class(s, i, end, n)) < 0) return -1;
        } else if (c == '\'' || c == '"') {
            int backslash = 0;
            if ((end = quoted_end(s, i, n, 0, &backslash)) == 0) return -1;
            if (c == '\'') {
                if (backslash) return -1;
                cls = SHAPE_STR;
            }
        } else if (c == '$' && i + 1 < n && is_digit(s[i + 1])) {
            end = i + 1;
            while (end < n && is_digit(s[end])) end++;
        } else if (c == '$') {
            size_t t = i + 1;
            if (t < n && ident_start(s[t]))
                while (t < n && dollar_cont(s[t])) t++;
            if (t < n && s[t] == '$') { /* a dollar quote: its delimiter s[i..t] again closes it */
                size_t dl = t + 1 - i, k = t + 1;
                if (dl > MAX_DOLLAR_TAG) return -1; /* (a long one could make this search quadratic) */
                while (k + dl <= n && memcmp(s + k, s + i, dl) != 0) k++;
                if (k + dl > n) return -1;
                end = k + dl;
            } else {
                end = i + 1;
            }
        } else {
            end = i + 1;
        }
        if (cls) {
            out[o++] = (unsigned char)cls;
            literals++;
        } else {
            memcpy(out + o, s + i, end - i);
            o += end - i;
        }
        i = end;
    }
    return literals ? (long)o : -1;
}

static uint64_t fnv1a(unsigned char type, const unsigned char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    h = (h ^ type) * 1099511628211ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h;
}

static decision_t *decision_find(dtable_t *t, unsigned char type, const unsigned char *text, size_t len) {
    uint64_t h = fnv1a(type, text, len);
    for (; t != NULL; t = t->base) {
        if (t->cap == 0) continue;
        for (size_t i = h & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
            decision_t *d = &t->v[i];
            if (d->key == NULL) break;
            if (d->hash == h && d->len == len + 1 && d->key[0] == type && memcmp(d->key + 1, text, len) == 0)
                return d;
        }
    }
    return NULL;
}

/* The decision for a text of a tagged connection: its exact text's, else its shape's; in the decisions given
 * at adoption, else in those Python answered during the stay. */
static decision_t *decision_for(Engine *e, conn_t *c, unsigned char type, const unsigned char *text, size_t len) {
    decision_t *d = decision_find(c->dec, type, text, len);
    if (d == NULL && c->extra != NULL) d = decision_find(c->extra, type, text, len);
    if (d != NULL || (c->dec->shapes == 0 && (c->extra == NULL || c->extra->shapes == 0))) return d;
    long klen = shape_key(text, len, e->shape);
    if (klen < 0) return NULL;
    d = decision_find(c->dec, (unsigned char)(type | 0x20), e->shape, (size_t)klen);
    if (d == NULL && c->extra != NULL) d = decision_find(c->extra, (unsigned char)(type | 0x20), e->shape, (size_t)klen);
    if (d != NULL) e->shape_hits++;
    return d;
}

static void dtable_unref(dtable_t *t) {
    if (t == NULL || t == &NO_DECISIONS || __atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    for (size_t i = 0; i < t->cap; i++) free(t->v[i].key);
    free(t->v);
    dtable_unref(t->base);
    free(t);
}

static dtable_t *dtable_ref(dtable_t *t) {
    if (t != &NO_DECISIONS) __atomic_add_fetch(&t->refs, 1, __ATOMIC_ACQ_REL);
    return t;
}

/* A statement of a tagged connection counted (its kind and writes), as Relay's hooks count it. */
static void count_tagged(Engine *e, int kind, unsigned char nslots, const unsigned short *slots) {
    e->statements_tagged[kind]++;
    for (int i = 0; i < nslots; i++) e->writes[slots[i]]++;
}

static void stmt_unref(stmt_t *s) {
    if (s != NULL && --s->refs == 0) free(s);
}

static void table_free(table_t *t) {
    for (int i = 0; i < t->n; i++) {
        free(t->v[i].name);
        free(t->v[i].params);
        stmt_unref(t->v[i].s);
    }
    free(t->v);
    t->v = NULL;
    t->n = t->cap = 0;
}

static named_t *table_find(table_t *t, const unsigned char *name, size_t len) {
    for (int i = 0; i < t->n; i++)
        if (t->v[i].len == len && memcmp(t->v[i].name, name, len) == 0) return &t->v[i];
    return NULL;
}

/* name -> s (a new reference is taken); -1 when out of memory or names. */
static int table_set(table_t *t, const unsigned char *name, size_t len, stmt_t *s) {
    named_t *slot = table_find(t, name, len);
    if (slot == NULL) {
        if (t->n >= MAX_NAMES) return -1;
        if (t->n == t->cap) {
            int cap = t->cap ? t->cap * 2 : 8;
            named_t *v = realloc(t->v, (size_t)cap * sizeof(*v));
            if (v == NULL) return -1;
            t->v = v;
            t->cap = cap;
        }
        unsigned char *copy = malloc(len ? len : 1);
        if (copy == NULL) return -1;
        memcpy(copy, name, len);
        slot = &t->v[t->n++];
        slot->name = copy;
        slot->len = len;
        slot->s = NULL;
        slot->params = NULL;
        slot->plen = 0;
    }
    s->refs++;
    stmt_unref(slot->s);
    slot->s = s;
    return 0;
}

static void table_pop(table_t *t, const unsigned char *name, size_t len) {
    named_t *slot = table_find(t, name, len);
    if (slot == NULL) return;
    free(slot->name);
    free(slot->params);
    stmt_unref(slot->s);
    *slot = t->v[--t->n];
}

/* A portal's Bind parameters, kept while its statement's reads are recorded (NULL, 0: forget them). */
static int portal_params(named_t *slot, const unsigned char *params, size_t len) {
    if (params == NULL) {
        free(slot->params);
        slot->params = NULL;
        slot->plen = 0;
        return 0;
    }
    if (slot->params == NULL || slot->plen < len) {
        unsigned char *buf = realloc(slot->params, len ? len : 1);
        if (buf == NULL) return -1;
        slot->params = buf;
    }
    memcpy(slot->params, params, len);
    slot->plen = len;
    return 0;
}

static stmt_t *stmt_new(int kind, int pyonly, long idx, const unsigned char *text, size_t len) {
    stmt_t *s = malloc(sizeof(*s) + len);
    if (s == NULL) return NULL;
    s->refs = 0;
    s->kind = kind;
    s->pyonly = pyonly;
    s->idx = idx;
    s->read = NO_READ;
    s->rerun = 0;
    s->alias = 0;
    s->promo = -1;
    s->nslots = 0;
    s->len = len;
    if (len) memcpy(s->text, text, len);
    return s;
}

/* ---- the relay (all below runs with e->mu held) ---- */

static int blocked(conn_t *c) {
    return c->stop_client || c->asking || (c->recall && c->qlen == 0 && !c->mid_batch && c->status == 'I') ||
           c->inflight >= MAX_INFLIGHT || c->watch == 2 || c->sheld != NULL;
}

static int idle_point(conn_t *c) { return c->qlen == 0 && !c->mid_batch && !c->skip; }

/* A statement of a session that may fail with the layer's row-changed 40001 (stmt_t.rerun) is watched when it
 * starts an implicit transaction (conn_t.watch): then Python may run it again after that failure, as READ
 * COMMITTED would have run it on the row's new version (proxy/rerun.py). */
static int starts_transaction(conn_t *c) { return c->status == 'I' && idle_point(c); }

/* One client message of the watched Query or batch; one that does not fit ends the watch. */
static void watch_add(conn_t *c, const unsigned char *m, size_t total) {
    if (c->wbuf == NULL && (c->wbuf = malloc(BUF_CAP)) == NULL) c->watch = 0;
    if (c->watch && c->wlen + total > BUF_CAP) c->watch = 0;
    if (!c->watch) return;
    memcpy(c->wbuf + c->wlen, m, total);
    c->wlen += total;
    if (m[0] == 'Q' || m[0] == 'S') c->watch = 2;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void ring_free(ring_t *r) {
    if (r->v == NULL) return;
    for (long long seq = r->base; seq < r->end; seq++) rec_free(&r->v[seq % READ_CAP]);
    free(r->v);
    r->v = NULL;
    r->base = r->end = 0;
}

static unsigned char *dup_bytes(const unsigned char *p, size_t n) {
    unsigned char *out = malloc(n ? n : 1);
    if (out != NULL) memcpy(out, p, n);
    return out;
}

/* A read starts (ReadTrace.pending_read): its record's sequence number, or -1 (not recorded, or dropped). Its
 * Bind's parameters, and the text of a Query taken by its shape's decision, are kept with it. Started: the
 * monotonic time of its message when the caller read it already, or -1. */
static long long read_start(Engine *e, conn_t *c, long ref, const unsigned char *params, size_t plen,
                            const unsigned char *text, size_t tlen, double started) {
    ring_t *r = &c->reads;
    if (r->v == NULL || ref == NO_READ) return -1;
    if (r->end - r->base >= READ_CAP) {
        e->reads_dropped++;
        return -1;
    }
    rec_t *rec = &r->v[r->end % READ_CAP];
    rec->pinned = params != NULL && plen <= PARAMS_INLINE;
    if (rec->pinned) memcpy(rec->pin, params, plen);
    rec->params = params != NULL && !rec->pinned ? dup_bytes(params, plen) : NULL;
    rec->plen = plen;
    rec->text = text != NULL ? dup_bytes(text, tlen) : NULL;
    rec->tlen = tlen;
    if ((params != NULL && rec_params(rec) == NULL) || (text != NULL && rec->text == NULL)) {
        rec_free(rec);
        e->reads_dropped++;
        return -1;
    }
    rec->ref = ref;
    rec->txn = c->txn;
    rec->xid = 0;
    c->txn_reads++;
    rec->state = 0;
    rec->rows = -1;
    rec->started = started >= 0 ? started : tick(c);
    return r->end++;
}

/* Its CommandComplete (ReadTrace.read_done): rows from "SELECT n", as Python reads the tag. */
static void read_done(Engine *e, conn_t *c, long long seq, const unsigned char *tag, int len) {
    rec_t *rec = &c->reads.v[seq % READ_CAP];
    if (len > 0 && tag[len - 1] == 0) len--;
    long long rows = -1;
    if (len > 7 && memcmp(tag, "SELECT ", 7) == 0) {
        rows = 0;
        for (int i = 7; i < len && rows >= 0; i++) {
            if (tag[i] < '0' || tag[i] > '9' || rows > (LLONG_MAX - 9) / 10) rows = -1;
            else rows = rows * 10 + (tag[i] - '0');
        }
    }
    double t = tick(c);
    rec->rows = rows;
    rec->txn = c->txn;
    rec->xid = 0;
    rec->wall = t; /* (monotonic: made the wall clock when taken) */
    rec->duration_us = (long long)((t - rec->started) * 1e6);
    rec->state = 1;
    e->reads_done++;
    if (!c->reads.marked && c->reads.end - c->reads.base >= READ_MARK) { /* Python is to take them */
        c->reads.marked = 1;
        e->notify = 1;
    }
}

/* A read that ends without its CommandComplete (an error, PortalSuspended, EmptyQueryResponse): none. */
static void read_failed(conn_t *c, long long seq) {
    rec_t *rec = &c->reads.v[seq % READ_CAP];
    rec_free(rec);
    rec->state = 2;
}

/* The reply to a promotion's Parse (Promotions.promote's callback): prepared, unless it failed or a text
 * that may deallocate statements was taken after it. */
static void promo_parsed(conn_t *c, entry_t *en, int ok) {
    promo_t *pr = &c->promos[en->promo - 1];
    if (pr->no == en->no && pr->state == PROMO_PARSING)
        pr->state = ok && en->dealloc == c->dealloc ? PROMO_PREPARED : PROMO_NONE;
    en->promo = 0;
}

static void push_rec(conn_t *c, char kind, double started, long long rec) {
    entry_t *en = &c->q[(c->head + c->qlen) % QCAP];
    en->kind = kind;
    en->inj = 0;
    en->rw = 0;
    en->promo = 0;
    en->started = started;
    en->rec = rec;
    c->qlen++;
    if (kind == 'Q' || kind == 'S') c->inflight++;
}

static void push(conn_t *c, char kind, double started) { push_rec(c, kind, started, -1); }

static entry_t *qhead(conn_t *c) { return c->qlen ? &c->q[c->head] : NULL; }

static entry_t pop(conn_t *c) {
    entry_t en = c->q[c->head];
    c->head = (c->head + 1) % QCAP;
    c->qlen--;
    if (en.kind == 'Q' || en.kind == 'S') c->inflight--;
    if (en.inj) c->inj_owed--;
    if (en.rw == 1) c->promo_owed--;
    if (en.promo && en.kind == 'P') promo_parsed(c, &en, 0); /* (ParseComplete takes it off its entry first) */
    if (en.rec >= 0) read_failed(c, en.rec); /* (a CommandComplete takes the record off its entry first) */
    return en;
}

/* Relay._extended: an extended-protocol message opens a batch (ended by Sync). */
static void push_extended(conn_t *c, char kind, long long rec) {
    if (!c->mid_batch) {
        c->mid_batch = 1;
        c->batch_started = tick(c);
    }
    push_rec(c, kind, 0.0, rec);
}

/* A statement goes out (ReadTrace.sent): anything but a recorded read or a transaction statement may write. */
static void txn_sent(conn_t *c, int kind, long read) {
    if (c->resolve >= 0 && read == NO_READ && kind != c->resolve) c->txn_wrote = 1;
}

/* ReadTrace.wants_xact: before a message that may end a transaction that read with no operation id and may
 * have written, ask the server its transaction id; only when the status is current (no ReadyForQuery owed:
 * a pipelined failure would make the question fail and the server skip the client's COMMIT). */
static int wants_xact(conn_t *c) {
    return c->resolve >= 0 && c->txn_reads && c->txn_wrote && c->status != 'E' && !c->skip && !c->copy_in &&
           c->inflight == 0;
}

/* The read records of the transaction that just ended take its id (those of older ones have theirs). */
static void stamp_xid(conn_t *c) {
    ring_t *r = &c->reads;
    if (r->v == NULL || c->txn_xid == 0) return;
    for (long long seq = r->end - 1; seq >= r->base && r->v[seq % READ_CAP].txn == c->txn; seq--)
        if (r->v[seq % READ_CAP].state == 1) r->v[seq % READ_CAP].xid = c->txn_xid; /* (not a later one's) */
}

static void update_masks(Engine *e, conn_t *c) {
    uint32_t want[2];
    want[CLIENT] = (!blocked(c) && c->out[SERVER].len == 0 ? EPOLLIN : 0) | (c->out[CLIENT].len ? EPOLLOUT : 0);
    want[SERVER] = (c->out[CLIENT].len == 0 && c->sheld == NULL ? EPOLLIN : 0) |
                   (c->out[SERVER].len ? EPOLLOUT : 0);
    for (int side = 0; side < 2; side++) {
        if (want[side] != c->mask[side]) {
            struct epoll_event ev = {.events = want[side], .data.ptr = &c->end[side]};
            if (epoll_ctl(e->epfd, EPOLL_CTL_MOD, c->fd[side], &ev) == 0) c->mask[side] = want[side];
        }
    }
}

static void promos_free(promo_t *v, int n) {
    for (int i = 0; i < n && v != NULL; i++) {
        free(v[i].sql);
        free(v[i].types);
    }
    free(v);
}

static void free_conn(conn_t *c) {
    promos_free(c->promos, c->npromos);
    free(c->repl);
    ring_free(&c->reads);
    enc_unref(c->enc);
    dtable_unref(c->dec);
    dtable_unref(c->extra);
    table_free(&c->stmts);
    table_free(&c->portals);
    free(c->cin);
    free(c->wbuf);
    free(c->sheld);
    free(c->pst);
    free(c->out[0].buf);
    free(c->out[1].buf);
    free(c);
}

static void detach(Engine *e, conn_t *c) {
    epoll_ctl(e->epfd, EPOLL_CTL_DEL, c->fd[CLIENT], NULL);
    epoll_ctl(e->epfd, EPOLL_CTL_DEL, c->fd[SERVER], NULL);
    conn_t **pp = &e->conns;
    while (*pp != NULL && *pp != c) pp = &(*pp)->next;
    if (*pp == c) *pp = c->next;
    c->dead = 1;
    /* Freed by the thread before its next epoll_wait: events already returned may still point here. */
    c->next = e->graveyard;
    e->graveyard = c;
    e->nconns--;
}

/* Take the connection out of the engine; the record tells Python the state to resume from. */
static handback_t *make_handback(Engine *e, conn_t *c, const char *reason, int err) {
    handback_t *h = calloc(1, sizeof(*h));
    if (h != NULL) {
        h->id = c->id;
        h->reason = reason;
        h->err = err;
        h->status = c->status;
        h->inflight = c->inflight;
        h->untaken = c->stop_client ? c->untaken : -1;
        for (int i = 0; i < c->qlen; i++) {
            const entry_t *en = &c->q[(c->head + i) % QCAP];
            h->kinds[i] = en->rw == 2 ? 'q' : en->kind; /* (replies.KIND_LETTERS: lower case, rewritten) */
        }
        h->kinds[c->qlen] = 0;
        h->mid_batch = c->mid_batch;
        h->skip = c->skip;
        h->stmts = c->stmts; /* moved: Python rebuilds Prepared.statements/portals from them */
        h->portals = c->portals;
        h->taken = c->taken;
        h->txn = c->txn;
        h->txn_reads = c->txn_reads;
        h->txn_wrote = c->txn_wrote;
        h->txn_xid = c->txn_xid;
        h->promos = c->promos; /* moved: Python's Promotions carry on from them */
        h->npromos = c->npromos;
        h->promo_count = c->promo_count;
        h->dealloc = c->dealloc;
        h->suspect = c->suspect;
        c->promos = NULL;
        c->npromos = 0;
        h->pst = c->pst;
        h->pst_len = c->pst_keep ? c->pst_at : c->pst_len; /* (one cut short: not kept) */
        h->pst_lost = c->pst_lost || c->pst_keep;
        c->pst = NULL;
        memset(&c->stmts, 0, sizeof(c->stmts));
        memset(&c->portals, 0, sizeof(c->portals));
        if (c->reads.v != NULL) { /* moved too: Python records the done reads, and resumes the owed ones */
            h->reads = c->reads;
            h->enc = enc_ref(c->enc);
            memset(&c->reads, 0, sizeof(c->reads));
            if (c->qlen && (h->qrec = malloc(sizeof(long long) * (size_t)c->qlen)) != NULL)
                for (int i = 0; i < c->qlen; i++) h->qrec[i] = c->q[(c->head + i) % QCAP].rec;
        }
        if (c->cin_len) {
            h->data = c->cin;
            h->len = c->cin_len;
            c->cin = NULL;
            e->bytes_up -= c->cin_len; /* Python counts them when it reads them */
        }
        if (c->sheld != NULL) { /* (otherwise a watched statement is not run again: Python did not see it) */
            h->batch = c->wbuf;
            h->blen = c->wlen;
            c->wbuf = NULL;
            h->sdata = c->sheld;
            h->slen = c->sheld_len;
            c->sheld = NULL;
        }
    }
    c->watch = 0;
    c->cin_len = 0;
    detach(e, c);
    return h;
}

static void handback(Engine *e, conn_t *c, const char *reason, int err) {
    if (c->dead) return;
    handback_t *h = make_handback(e, c, reason, err);
    if (h == NULL) return;
    if (e->hb_tail) e->hb_tail->next = h;
    else e->hb_head = h;
    e->hb_tail = h;
    e->notify = 1;
}

static const char *ready_to_hand_back(conn_t *c) {
    if (c->out[0].len || c->out[1].len || c->cstream_left || c->shdr_have || c->sbody_left) return NULL;
    if (c->inj_owed) return NULL; /* (Python could not tell the question's replies from the client's) */
    if (c->promo_owed) return NULL; /* (nor what a promotion's replies mean for its name) */
    if (c->sheld != NULL) return "rerun"; /* a watched statement's error or notice is next: Python's */
    /* A COPY FROM STDIN waits for the client: Python takes it over with the query still in flight. Inside
     * an extended batch the server answers nothing before the client's Sync, which comes after the message
     * C does not take: Python takes over at once with the replies still owed (c->q mirrors ReplyQueue.pending). */
    if (c->stop_client && (c->qlen == 0 || c->copy_in || c->mid_batch || c->skip)) return "client message";
    if (c->recall && idle_point(c) && c->status == 'I') return "recall";
    return NULL;
}

static int out_append(outbuf_t *o, const unsigned char *data, size_t len) {
    if (o->off && o->off == o->len) o->off = o->len = 0;
    if (o->len + len > o->cap) {
        if (o->off) {
            memmove(o->buf, o->buf + o->off, o->len - o->off);
            o->len -= o->off;
            o->off = 0;
        }
        if (o->len + len > o->cap) {
            size_t cap = o->len + len > BUF_CAP ? o->len + len : BUF_CAP;
            unsigned char *buf = realloc(o->buf, cap);
            if (buf == NULL) return -1;
            o->buf = buf;
            o->cap = cap;
        }
    }
    memcpy(o->buf + o->len, data, len);
    o->len += len;
    return 0;
}

static const char *const CLOSED[2] = {"client closed", "upstream closed"};
static const char *const FAILED[2] = {"client error", "upstream error"};

/* Write to one side; what does not fit is kept (and the other side is no longer read until it is sent). */
static void send_to(Engine *e, conn_t *c, int side, const unsigned char *data, size_t len) {
    outbuf_t *o = &c->out[side];
    ssize_t w = 0;
    if (o->len == 0) {
        w = send(c->fd[side], data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                handback(e, c, FAILED[side], errno);
                return;
            }
            w = 0;
        }
    }
    if ((size_t)w < len && out_append(o, data + w, len - (size_t)w) < 0) handback(e, c, FAILED[side], ENOMEM);
}

static void flush_out(Engine *e, conn_t *c, int side) {
    outbuf_t *o = &c->out[side];
    while (o->len > o->off) {
        ssize_t w = send(c->fd[side], o->buf + o->off, o->len - o->off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EINTR) continue;
            handback(e, c, FAILED[side], errno);
            return;
        }
        o->off += (size_t)w;
    }
    o->off = o->len = 0;
    if (o->cap > BUF_CAP) { /* shrink after an unusually large backlog */
        free(o->buf);
        o->buf = NULL;
        o->cap = 0;
    }
}

/* ReadTrace.ask_xact inside the client's batch: the question goes before the message being taken (which is
 * then taken again: asked); its replies are dropped (server_header), an ErrorResponse is the client's. */
static void ask_xact(Engine *e, conn_t *c) {
    static const char kinds[XACT_ENTRIES] = {'C', 'P', 'B', 'E', 'C', 'C'};
    if (out_append(&c->out[SERVER], e->xact, e->xact_len) < 0) { /* (sent with the client's bytes) */
        handback(e, c, FAILED[SERVER], ENOMEM);
        return;
    }
    for (int i = 0; i < XACT_ENTRIES; i++) {
        push_extended(c, kinds[i], -1);
        c->q[(c->head + c->qlen - 1) % QCAP].inj = 1;
    }
    c->inj_owed += XACT_ENTRIES;
    c->asked = 1;
    c->watch = 0; /* (a batch that asks it is not run again: its replies would come back to Python mid-question) */
}

static void stop_client(conn_t *c, unsigned char type) {
    c->stop_client = 1;
    c->untaken = type;
}

/* ---- a session's unnamed reads run as the proxy's named statements (proxy/unnamed.py), by Python's
 * 'U' decisions: C sends what Promotions says Python sends, byte for byte ---- */

static int contains_ci(const unsigned char *s, size_t n, const char *word) {
    size_t w = strlen(word);
    for (size_t i = 0; i + w <= n; i++) {
        size_t k = 0;
        while (k < w && (s[i + k] | 0x20) == (unsigned char)word[k]) k++;
        if (k == w) return 1;
    }
    return 0;
}

/* Promotions.forget_unnamed for a text C takes: one that may deallocate statements (DEALLOCATE, DISCARD
 * ALL, anywhere in the message body as Python's regex searches it) drops the proxy's prepared ones. */
static void promos_forget_if_deallocates(conn_t *c, const unsigned char *body, size_t n) {
    int any = 0;
    for (int i = 0; i < c->npromos; i++) any |= c->promos[i].state != PROMO_NONE;
    if (!any || !(contains_ci(body, n, "deallocate") || contains_ci(body, n, "discard"))) return;
    for (int i = 0; i < c->npromos; i++)
        if (c->promos[i].state == PROMO_PREPARED) c->promos[i].state = PROMO_NONE;
    c->dealloc++;
}

/* A simple Query drops the server's unnamed statement: it no longer stands for a name of the proxy's. */
static void promos_query(conn_t *c, const unsigned char *body, size_t n) {
    named_t *unnamed = table_find(&c->stmts, (const unsigned char *)"", 0);
    if (unnamed != NULL) unnamed->s->alias = 0, unnamed->s->promo = -1;
    promos_forget_if_deallocates(c, body, n);
}

/* Room for a message of n bytes sent in place of the client's (conn_t.repl). */
static unsigned char *repl_room(conn_t *c, size_t n) {
    if (n > c->repl_cap) {
        unsigned char *buf = realloc(c->repl, n);
        if (buf == NULL) return NULL;
        c->repl = buf;
        c->repl_cap = n;
    }
    c->repl_len = n;
    return c->repl;
}

/* A message header and body parts into conn_t.repl: the bytes sent in place of the client's message. */
static int repl_message(conn_t *c, unsigned char type, const unsigned char *const *parts, const size_t *lens,
                        int nparts) {
    size_t n = 5;
    for (int i = 0; i < nparts; i++) n += lens[i];
    unsigned char *out = repl_room(c, n);
    if (out == NULL || n - 1 > UINT32_MAX) return -1;
    out[0] = type;
    uint32_t ml = (uint32_t)(n - 1);
    out[1] = (unsigned char)(ml >> 24), out[2] = (unsigned char)(ml >> 16);
    out[3] = (unsigned char)(ml >> 8), out[4] = (unsigned char)ml;
    size_t o = 5;
    for (int i = 0; i < nparts; i++) {
        if (lens[i]) memcpy(out + o, parts[i], lens[i]);
        o += lens[i];
    }
    return 0;
}

/* The proxy's name number no, NUL included ("__cowproxy_unnamed_<no>\0"); its length with the NUL. */
static size_t promo_name(char *out, size_t cap, int no) {
    return (size_t)snprintf(out, cap, PROMOTED_PREFIX "%d", no) + 1;
}

/* The last entry pushed was sent for a promotion (Entry.rewritten, Entry.promoted). */
static void mark_promoted(conn_t *c, int promo, int no) {
    entry_t *en = &c->q[(c->head + c->qlen - 1) % QCAP];
    en->rw = 1;
    en->promo = (short)(promo + 1);
    en->no = no;
    en->dealloc = c->dealloc;
    c->promo_owed++;
    c->watch = 0; /* (a batch with one is not run again: Python's plan would resend the client's bytes) */
}

/* Promotions.promote for an unnamed Parse of a promoted text (decision d): once the server has the proxy's
 * statement, an empty unnamed Parse in its place (ParseComplete, and the server's unnamed statement dropped
 * as the client expects); the first time, a Parse of a new name with the rewritten text; with no names left
 * or its Parse still unanswered, the rewritten text unnamed. The client's unnamed statement then stands for
 * the name (stmt_t.alias). Returns 3 (sent in another form: conn_t.repl), or 0: Python must see it. */
static int take_promoted(Engine *e, conn_t *c, decision_t *d, const unsigned char *text, size_t len) {
    promo_t *pr = &c->promos[d->promo];
    int prepared = 0;
    for (int i = 0; i < c->npromos; i++) prepared |= c->promos[i].state == PROMO_PREPARED;
    if (c->promo_count >= c->promo_max && !prepared) return 0; /* (Promotions.can_promote: analysed unnamed) */
    stmt_t *st = stmt_new(d->kind, 0, -1, text, len);
    if (st == NULL) return 0;
    st->read = d->read;
    st->rerun = d->rerun;
    st->nslots = d->nslots;
    memcpy(st->slots, d->slots, sizeof(st->slots));
    char name[48];
    size_t nlen = 1;
    int fresh = 0;
    name[0] = 0;
    if (pr->state == PROMO_PREPARED) {
        st->alias = pr->no;
    } else if (pr->state == PROMO_NONE && c->promo_count < c->promo_max) {
        st->alias = ++c->promo_count;
        nlen = promo_name(name, sizeof(name), st->alias);
        fresh = 1;
    }
    int rc;
    if (st->alias && !fresh) {
        static const unsigned char empty[4] = {0, 0, 0, 0}; /* name "", text "", no parameter types */
        const unsigned char *parts[] = {empty};
        size_t lens[] = {sizeof(empty)};
        rc = repl_message(c, 'P', parts, lens, 1);
    } else {
        const unsigned char *parts[] = {(const unsigned char *)name, pr->sql, (const unsigned char *)"", pr->types};
        size_t lens[] = {nlen, pr->sql_len, 1, pr->types_len};
        rc = repl_message(c, 'P', parts, lens, 4);
    }
    if (rc < 0 || table_set(&c->stmts, (const unsigned char *)"", 0, st) < 0) {
        if (fresh) c->promo_count--;
        if (st->refs == 0) free(st);
        return 0;
    }
    if (fresh) {
        pr->no = st->alias;
        pr->state = PROMO_PARSING;
    }
    if (st->alias) st->promo = d->promo;
    e->decision_hits++;
    e->rewrites++;
    push_extended(c, 'P', -1);
    mark_promoted(c, fresh ? d->promo : -1, st->alias);
    return 3;
}

/* A Bind of the unnamed statement standing for a name of the proxy's: the Bind with that name
 * (protocol.rename_bind_statement). portal_end: after the portal's NUL; rest: after the statement's NUL. */
static int rename_bind(conn_t *c, const stmt_t *st, const unsigned char *b, size_t portal_end, size_t rest,
                       size_t n) {
    char name[48];
    size_t nlen = promo_name(name, sizeof(name), st->alias);
    const unsigned char *parts[] = {b, (const unsigned char *)name, b + rest};
    size_t lens[] = {portal_end, nlen, n - rest};
    if (repl_message(c, 'B', parts, lens, 3) < 0) return -1;
    return 0;
}

/* A Describe of the unnamed statement standing for a name of the proxy's: of that name. */
static int rename_describe(conn_t *c, const stmt_t *st) {
    char name[48];
    size_t nlen = promo_name(name, sizeof(name), st->alias);
    const unsigned char *parts[] = {(const unsigned char *)"S", (const unsigned char *)name};
    size_t lens[] = {1, nlen};
    return repl_message(c, 'D', parts, lens, 2);
}

/* Relay.failed for a message sent rewritten (a promotion's, or a Query's): one that fails as on a stale catalog
 * makes the catalog suspect (C takes no more rewritten texts: Python checks it first); a Bind or Describe of the
 * proxy's name that fails forgets the name (Promotions.failed: a new one is parsed the next time). */
static void promo_error(conn_t *c, const entry_t *h) {
    static const char *const stale[] = {"42601", "42703", "42P01", "42804", "0A000"};
    const unsigned char *code = NULL;
    for (int pos = 0; pos < c->ebuf_have && c->ebuf[pos] != 0;) {
        unsigned char field = c->ebuf[pos++];
        const unsigned char *end = memchr(c->ebuf + pos, 0, (size_t)(c->ebuf_have - pos));
        if (end == NULL) break;
        if (field == 'C' && end - (c->ebuf + pos) == 5) code = c->ebuf + pos;
        pos = (int)(end - c->ebuf) + 1;
    }
    for (int i = 0; code != NULL && i < 5; i++)
        if (memcmp(code, stale[i], 5) == 0) c->suspect = 1;
    if (h->kind == 'B' || h->kind == 'D') {
        for (int i = 0; i < c->npromos; i++)
            if (c->promos[i].no == h->no && c->promos[i].state == PROMO_PREPARED) c->promos[i].state = PROMO_NONE;
    }
}

/* One whole Parse, Bind, Describe, Execute, Close, Sync or Flush: take it (and keep the relay's bookkeeping for it)
 * if Python would forward it unchanged for an untagged connection, or as a session's decision says; 0: Python
 * must see it; 3: taken, sent in another form (conn_t.repl: a promotion). */
static int take_extended(Engine *e, conn_t *c, const unsigned char *m, size_t total) {
    unsigned char type = m[0];
    const unsigned char *b = m + 5;
    size_t n = total - 5;
    long p1, p2;
    long long rec = -1;
    const stmt_t *renamed = NULL; /* a Bind or Describe sent to the name the unnamed statement stands for */
    int asked = c->asked; /* (the question went before this message: take it now) */
    c->asked = 0;
    if (type == 'H') return 1; /* Flush: nothing owed for it */
    if (c->qlen >= QCAP - 1) return 0;
    if (type == 'S') {
        if (!asked && c->status == 'I' && wants_xact(c)) /* an implicit transaction's end */
            return c->qlen + XACT_ENTRIES < QCAP - 1 ? 2 : 0;
        c->skip = 0;
        c->mid_batch = 0;
        push(c, 'S', c->batch_started ? c->batch_started : tick(c));
        c->batch_started = 0;
        return 1;
    }
    if (c->skip) return 1; /* the server discards up to Sync; so does Relay (no decisions, no entries) */
    switch (type) {
    case 'P': {
        if ((p1 = cstring(b, 0, n)) < 0 || (p2 = cstring(b, (size_t)p1, n)) < 0 || (size_t)p2 + 2 > n) return 0;
        size_t count = ((size_t)b[p2] << 8) | b[p2 + 1];
        if ((size_t)p2 + 2 + 4 * count != n) return 0;
        const unsigned char *text = b + p1;
        size_t len = (size_t)(p2 - p1 - 1);
        if (has_comment_opener(text, len)) return 0; /* a comment may carry tags */
        decision_t *d = NULL;
        if (c->tagged && p1 == 1 && c->npromos && (d = decision_find(c->dec, 'U', b + 1, n - 1)) != NULL) {
            if (c->suspect) return 0;
            promos_forget_if_deallocates(c, b, n);
            return take_promoted(e, c, d, text, len); /* (keyed by the text and its parameter types) */
        }
        if (c->tagged && (d = decision_for(e, c, 'P', text, len)) == NULL) return 0; /* Python decides */
        promos_forget_if_deallocates(c, b, n);
        if (d != NULL && d->rerun && starts_transaction(c)) c->watch = 1, c->wlen = 0;
        stmt_t *st = stmt_new(d ? d->kind : text_kind(e, text, len), 0, -1, text, len);
        if (st == NULL) return 0;
        if (d != NULL) {
            e->decision_hits++;
            st->rerun = d->rerun;
            st->nslots = d->nslots;
            memcpy(st->slots, d->slots, sizeof(st->slots));
            st->read = d->read;
        }
        if (table_set(&c->stmts, b, (size_t)p1 - 1, st) < 0) {
            free(st);
            return 0;
        }
        break;
    }
    case 'B': {
        if ((p1 = cstring(b, 0, n)) < 0 || (p2 = cstring(b, (size_t)p1, n)) < 0) return 0;
        named_t *st = table_find(&c->stmts, b + p1, (size_t)(p2 - p1 - 1));
        if (st != NULL && st->s->rerun && starts_transaction(c)) c->watch = 1, c->wlen = 0;
        if (!asked && st != NULL && st->s->kind == c->resolve && wants_xact(c)) /* COMMIT, ROLLBACK, ... */
            return c->qlen + XACT_ENTRIES < QCAP - 1 ? 2 : 0;
        if (st != NULL && (st->s->pyonly || table_set(&c->portals, b, (size_t)p1 - 1, st->s) < 0)) return 0;
        if (st != NULL && c->reads.v != NULL) {
            /* The parameters (after the portal's name): with the text, the identity of the read. */
            named_t *portal = table_find(&c->portals, b, (size_t)p1 - 1);
            int read = st->s->read != NO_READ;
            if (portal_params(portal, read ? b + p1 : NULL, read ? n - (size_t)p1 : 0) < 0) return 0;
        }
        if (st != NULL && st->s->alias && p2 == p1 + 1) {
            if (rename_bind(c, st->s, b, (size_t)p1, (size_t)p2, n) < 0) return 0;
            renamed = st->s;
        }
        break;
    }
    case 'E': {
        if ((p1 = cstring(b, 0, n)) < 0 || (size_t)p1 + 4 != n) return 0;
        named_t *portal = table_find(&c->portals, b, (size_t)p1 - 1);
        if (portal != NULL) {
            if (portal->s->pyonly) return 0;
            if (c->tagged) count_tagged(e, portal->s->kind, portal->s->nslots, portal->s->slots);
            else e->statements[portal->s->kind]++;
            rec = read_start(e, c, portal->s->read, portal->params, portal->plen, NULL, 0, -1);
            txn_sent(c, portal->s->kind, portal->s->read);
        } else if (c->resolve >= 0) {
            c->txn_wrote = 1; /* (a portal Python knows nothing of) */
        }
        break;
    }
    case 'C': {
        if (n < 1 || (b[0] != 'S' && b[0] != 'P') || (p1 = cstring(b, 1, n)) < 0 || (size_t)p1 != n) return 0;
        table_pop(b[0] == 'S' ? &c->stmts : &c->portals, b + 1, (size_t)p1 - 2);
        break;
    }
    case 'D':
        if (n == 2 && b[0] == 'S' && b[1] == 0) { /* of the unnamed statement */
            named_t *st = table_find(&c->stmts, (const unsigned char *)"", 0);
            if (st != NULL && st->s->alias) {
                if (rename_describe(c, st->s) < 0) return 0;
                renamed = st->s;
            }
        }
        break;
    default:
        return 0;
    }
    push_extended(c, (char)type, rec);
    if (renamed == NULL) return 1;
    mark_promoted(c, -1, renamed->alias);
    return 3;
}

/* Ask Python for the decision of a session's Query text (stops reading the client until the answer: the Query
 * stays in cin, first). -1: no memory (the connection is handed back at that Query, as without asking). */
static int ask_decision(Engine *e, conn_t *c, const unsigned char *text, size_t len) {
    request_t *r = calloc(1, sizeof(*r));
    if (r == NULL || (r->text = malloc(len ? len : 1)) == NULL) {
        free(r);
        return -1;
    }
    memcpy(r->text, text, len);
    r->len = len;
    r->id = c->id;
    r->seq = c->asking = ++e->rq_seq;
    if (e->rq_tail) e->rq_tail->next = r;
    else e->rq_head = r;
    e->rq_tail = r;
    e->notify = 1;
    return 0;
}

/* Walk client messages in buf; returns how many leading bytes are to be forwarded. */
static size_t parse_client(Engine *e, conn_t *c, const unsigned char *buf, size_t len) {
    size_t pos = 0;
    while (pos < len) {
        if (c->cstream_left) {
            size_t take = len - pos < c->cstream_left ? len - pos : (size_t)c->cstream_left;
            pos += take;
            c->cstream_left -= take;
            continue;
        }
        if (blocked(c) || len - pos < 5) break;
        unsigned char type = buf[pos];
        uint32_t ml = be32(buf + pos + 1);
        uint64_t total = (uint64_t)ml + 1;
        if (ml < 4 || total > c->max_message) {
            stop_client(c, type);
            break;
        }
        if (type == 'Q' && !c->copy_in) {
            if (total > BUF_CAP || c->mid_batch || c->skip || c->qlen >= QCAP - 1) {
                stop_client(c, type);
                break;
            }
            if (len - pos < total) break;
            if (!query_ok(buf + pos, (size_t)total)) {
                stop_client(c, type);
                break;
            }
            if (c->tagged) {
                unsigned long long shape_hits = e->shape_hits;
                decision_t *d = decision_for(e, c, 'Q', buf + pos + 5, (size_t)total - 6);
                /* Python decides the text, the connection stays (once: an answer C cannot find the text by hands
                 * back, as without asking, rather than asking again) */
                if (d == NULL && c->may_ask && !c->answered) {
                    if (ask_decision(e, c, buf + pos + 5, (size_t)total - 6) < 0) stop_client(c, type);
                    break;
                }
                /* (A simple-query COMMIT to ask before: Python asks, in a batch of its own. A rewritten text
                 * after one failed as on a stale catalog: Python checks the catalog first.) */
                if (d == NULL || (d->kind == c->resolve && wants_xact(c)) || (d->sql != NULL && c->suspect)) {
                    stop_client(c, type);
                    break;
                }
                const unsigned char *sent = buf + pos; /* (what goes to the server: watched as sent) */
                size_t sent_len = (size_t)total;
                if (d->sql != NULL) { /* Relay._client_query's rewritten text, in place of the client's */
                    const unsigned char *parts[] = {d->sql, (const unsigned char *)""};
                    size_t lens[] = {d->sql_len, 1};
                    if (repl_message(c, 'Q', parts, lens, 2) < 0) {
                        stop_client(c, type);
                        break;
                    }
                    sent = c->repl, sent_len = c->repl_len;
                }
                if (d->rerun && starts_transaction(c)) c->watch = 1, c->wlen = 0;
                if (c->npromos) promos_query(c, buf + pos + 5, (size_t)total - 5);
                if (c->answered) { /* (Python counted its analysis: a hit or a miss) */
                    c->answered = 0;
                    e->shape_hits = shape_hits;
                } else {
                    e->decision_hits++;
                }
                count_tagged(e, d->kind, d->nslots, d->slots);
                /* (By its shape's decision: the record keeps the text, its statement.) */
                const unsigned char *own = d->key[0] == 'q' ? buf + pos + 5 : NULL;
                double t = tick(c); /* (the Query's and its record's start) */
                push_rec(c, 'Q', t, read_start(e, c, d->read, NULL, 0, own, (size_t)total - 6, t));
                txn_sent(c, d->kind, d->read);
                if (c->watch == 1) watch_add(c, sent, sent_len);
                if (d->sql != NULL) { /* (its error may show a stale catalog: promo_error) */
                    c->q[(c->head + c->qlen - 1) % QCAP].rw = 2;
                    e->rewrites++;
                    c->taken++;
                    c->repl_skip = (size_t)total; /* sent in another form (process_client) */
                    break;
                }
            } else {
                e->statements[text_kind(e, buf + pos + 5, (size_t)total - 6)]++;
                push(c, 'Q', now());
            }
            c->taken++;
            pos += (size_t)total;
        } else if (type == 'd' && c->copy_in) {
            pos += 5; /* stream the body: a large CopyData is not buffered whole */
            c->cstream_left = ml - 4;
        } else if ((type == 'c' || type == 'f') && c->copy_in && total <= BUF_CAP) {
            if (len - pos < total) break;
            pos += (size_t)total;
        } else if (!c->copy_in && total <= BUF_CAP && memchr("PBDECSH", type, 7) != NULL && type != 0) {
            if (len - pos < total) break;
            int took = take_extended(e, c, buf + pos, (size_t)total);
            if (took == 2) { /* the question first (process_client) */
                c->ask = 1;
                break;
            }
            if (!took) {
                stop_client(c, type);
                break;
            }
            if (c->watch == 1) watch_add(c, buf + pos, (size_t)total);
            c->taken++;
            if (took == 3) { /* sent in another form (process_client) */
                c->repl_skip = (size_t)total;
                break;
            }
            pos += (size_t)total;
        } else {
            stop_client(c, type);
            break;
        }
    }
    return pos;
}

/* Forward what can go from buf (the scratch buffer or c->cin) and keep the rest in c->cin. */
static void process_client(Engine *e, conn_t *c, unsigned char *buf, size_t len) {
    c->tick = 0;
    size_t fwd = parse_client(e, c, buf, len);
    if (!c->ask && !c->repl_skip) {
        if (fwd) send_to(e, c, SERVER, buf, fwd);
    } else { /* the question goes in the middle, or a message in another form: gathered, then one send */
        size_t more = fwd;
        fwd = 0;
        for (;;) {
            if (more && out_append(&c->out[SERVER], buf + fwd, more) < 0) {
                handback(e, c, FAILED[SERVER], ENOMEM);
                return;
            }
            fwd += more;
            if (c->ask) {
                c->ask = 0;
                ask_xact(e, c);
            } else if (c->repl_skip) {
                if (out_append(&c->out[SERVER], c->repl, c->repl_len) < 0) {
                    handback(e, c, FAILED[SERVER], ENOMEM);
                    return;
                }
                fwd += c->repl_skip; /* the client's message, sent in that form */
                c->repl_skip = 0;
            } else {
                break;
            }
            if (c->dead) return;
            more = parse_client(e, c, buf + fwd, len - fwd);
        }
        flush_out(e, c, SERVER);
    }
    if (c->dead) return;
    size_t rest = len - fwd;
    if (rest && c->cin == NULL) {
        c->cin = malloc(BUF_CAP);
        if (c->cin == NULL) {
            handback(e, c, FAILED[CLIENT], ENOMEM);
            return;
        }
    }
    if (rest) memmove(c->cin, buf + fwd, rest);
    c->cin_len = rest;
}

static void client_read(Engine *e, conn_t *c) {
    if (c->out[SERVER].len || blocked(c)) return; /* not armed for reading: an event from before the change */
    unsigned char *buf = c->cin_len ? c->cin : e->scratch;
    size_t have = c->cin_len;
    if (have >= BUF_CAP) return; /* cannot happen: a message that large is not taken */
    ssize_t n = recv(c->fd[CLIENT], buf + have, BUF_CAP - have, MSG_DONTWAIT);
    if (n == 0) {
        handback(e, c, CLOSED[CLIENT], 0);
        return;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) handback(e, c, FAILED[CLIENT], errno);
        return;
    }
    e->bytes_up += (unsigned long long)n;
    process_client(e, c, buf, have + (size_t)n);
}

static void count_error(Engine *e, const unsigned char *body, int len) {
    char cls[2] = {'?', '?'};
    int pos = 0;
    while (pos < len && body[pos] != 0) {
        unsigned char field = body[pos++];
        const unsigned char *end = memchr(body + pos, 0, (size_t)(len - pos));
        if (field == 'C' && len - pos >= 2) {
            cls[0] = (char)body[pos];
            cls[1] = (char)body[pos + 1];
            break;
        }
        if (end == NULL) break;
        pos = (int)(end - body) + 1;
    }
    for (int i = 0; i < e->nerror_classes; i++) {
        if (e->error_class[i][0] == cls[0] && e->error_class[i][1] == cls[1]) {
            e->error_count[i]++;
            return;
        }
    }
    if (e->nerror_classes < MAX_ERROR_CLASSES) {
        int i = e->nerror_classes++;
        e->error_class[i][0] = cls[0];
        e->error_class[i][1] = cls[1];
        e->error_count[i] = 1;
    }
}

/* A ParameterStatus header (whole: type and length): kept from here, unless the stay's would grow too long. */
static void pst_begin(conn_t *c, uint32_t ml) {
    c->pst_keep = 0;
    if (c->pst_lost) return;
    size_t need = c->pst_len + (size_t)ml + 1;
    if (ml > PST_MAX || need > PST_MAX) {
        c->pst_lost = 1;
        return;
    }
    if (need > c->pst_cap) {
        size_t cap = c->pst_cap ? c->pst_cap : 256;
        while (cap < need) cap *= 2;
        unsigned char *buf = realloc(c->pst, cap);
        if (buf == NULL) {
            c->pst_lost = 1;
            return;
        }
        c->pst = buf;
        c->pst_cap = cap;
    }
    c->pst_at = c->pst_len;
    memcpy(c->pst + c->pst_len, c->shdr, 5);
    c->pst_len += 5;
    c->pst_keep = 1;
}

/* The ParameterStatus just read in whole: an earlier one of the same name goes (the last one counts). */
static void pst_done(conn_t *c) {
    c->pst_keep = 0;
    const unsigned char *name = c->pst + c->pst_at + 5;
    size_t room = c->pst_len - c->pst_at - 5;
    const unsigned char *nul = memchr(name, 0, room);
    if (nul == NULL) return; /* (malformed: kept as sent, Python finds it so) */
    size_t nlen = (size_t)(nul - name) + 1;
    for (size_t m = 0; m < c->pst_at;) {
        size_t mlen = (size_t)be32(c->pst + m + 1) + 1;
        if (mlen >= 5 + nlen && memcmp(c->pst + m + 5, name, nlen) == 0) {
            memmove(c->pst + m, c->pst + m + mlen, c->pst_len - m - mlen);
            c->pst_len -= mlen;
            c->pst_at -= mlen;
            return;
        }
        m += mlen;
    }
}

/* ReplyQueue._on_pass: the reply that ends the extended-protocol message at the head of the queue. */
static void server_header(conn_t *c, unsigned char type) {
    entry_t *h = qhead(c);
    if (h == NULL) return;
    if (type == '1' && h->kind == 'P' && h->promo) promo_parsed(c, h, 1); /* the proxy's statement is ready */
    if (type == 'C' && h->rec >= 0) { /* a recorded read's CommandComplete: its body is read for the tag */
        c->cur_rec = h->rec;
        h->rec = -1; /* (a simple Query's first one: ReadTrace.read_done) */
    }
    char want = 0;
    switch (type) {
    case '1': want = 'P'; break;
    case '2': want = 'B'; break;
    case '3': want = 'C'; break;
    case 'T':
    case 'n': want = 'D'; break;
    case 'C':
    case 'I':
    case 's': want = 'E'; break;
    default: return;
    }
    if (h->kind == want) pop(c);
}

static void server_message(Engine *e, conn_t *c) {
    switch (c->stype) {
    case 'Z': { /* ReplyQueue._ready: it answers the first Query or Sync owed */
        if (c->ebuf_have >= 1) c->status = (char)c->ebuf[0];
        c->copy_in = 0;
        double started = 0.0;
        while (c->qlen) {
            entry_t en = pop(c);
            if (en.kind == 'Q' || en.kind == 'S') {
                started = en.started;
                break;
            }
        }
        if (started) {
            double seconds = tick(c) - started;
            int i = 0;
            while (i < e->nbounds && seconds > e->bounds[i]) i++; /* bisect_left */
            e->latency[i]++;
            e->latency_sum += seconds;
        }
        if (c->status == 'I' && c->qlen == 0) c->mid_batch = 0;
        if (c->status == 'I') { /* (ReadTrace.ended) */
            stamp_xid(c);
            c->txn_xid = 0;
            c->txn++;
            if (c->qlen == 0) c->txn_reads = c->txn_wrote = 0;
        }
        break;
    }
    case 'E': { /* ReplyQueue._error: in the extended protocol the server now skips everything up to Sync */
        count_error(e, c->ebuf, c->ebuf_have);
        entry_t *h = qhead(c);
        if (h != NULL && h->rw) promo_error(c, h);
        if (h != NULL && h->kind != 'Q' && h->kind != 'S') {
            while (c->qlen && qhead(c)->kind != 'S') pop(c);
            if (c->qlen == 0) c->skip = 1;
        }
        break;
    }
    case 'G': /* CopyInResponse */
    case 'W': { /* CopyBothResponse */
        /* ReplyQueue._copy_started: the server ignores the Syncs sent after the COPY's Execute (libpq sends one
         * before the data): no ReadyForQuery answers them. C takes no CopyDone before this point, so every
         * Sync still owed behind the head is one of those. */
        c->copy_in = 1;
        int kept = 1;
        for (int i = 1; i < c->qlen; i++) {
            entry_t en = c->q[(c->head + i) % QCAP];
            if (en.kind == 'S') {
                c->inflight--;
                continue;
            }
            c->q[(c->head + kept++) % QCAP] = en;
        }
        if (kept < c->qlen) {
            c->qlen = kept;
            if (c->q[c->head].kind == 'E') c->mid_batch = 1;
        }
        break;
    }
    case 'D': /* the question's answer: one column, the transaction id's digits or NULL */
        if (c->sdrop && c->ebuf_have >= 6) {
            int32_t n = (int32_t)be32(c->ebuf + 2);
            unsigned long long xid = 0;
            for (int i = 0; n > 0 && n <= 20 && i < n && 6 + i < c->ebuf_have; i++)
                xid = xid * 10 + (unsigned long long)(c->ebuf[6 + i] - '0');
            c->txn_xid = xid;
        }
        break;
    case 'C':
        if (c->cur_rec >= 0) {
            read_done(e, c, c->cur_rec, c->ebuf, c->ebuf_have);
            c->cur_rec = -1;
        }
        break;
    case 'S':
        if (c->pst_keep) pst_done(c);
        break;
    default:
        break;
    }
}

/* A reply that shows how a watched statement ended (its rows, its CommandComplete, a COPY, ReadyForQuery: an
 * error can no longer be its failure to run again), given the head of the queue before the reply. */
static int watch_decided(unsigned char type, char head) {
    return (type != 0 && memchr("CDIsGHWZ", type, 8) != NULL) || (type == 'T' && head == 'Q');
}

/* Follow the server's message headers through one chunk, which is relayed as is but for the replies to the
 * question (ask_xact): those are cut out of it; and a watched statement's ErrorResponse or NoticeResponse stops
 * it there (*cut: its offset in buf, else len). Returns the length left to relay, or -1. */
static int parse_server(Engine *e, conn_t *c, unsigned char *buf, size_t len, size_t *cut) {
    size_t pos = 0, w = 0;
    *cut = len;
    while (pos < len) {
        if (c->sbody_left) {
            size_t take = len - pos < c->sbody_left ? len - pos : (size_t)c->sbody_left;
            if ((c->stype == 'E' || c->stype == 'Z' || (c->stype == 'C' && c->cur_rec >= 0) ||
                 (c->stype == 'D' && c->sdrop)) &&
                c->ebuf_have < EBUF) {
                size_t keep = take < (size_t)(EBUF - c->ebuf_have) ? take : (size_t)(EBUF - c->ebuf_have);
                memcpy(c->ebuf + c->ebuf_have, buf + pos, keep);
                c->ebuf_have += (int)keep;
            }
            if (c->stype == 'S' && c->pst_keep) { /* (room made at its header) */
                memcpy(c->pst + c->pst_len, buf + pos, take);
                c->pst_len += take;
            }
            if (!c->sdrop) {
                if (w != pos) memmove(buf + w, buf + pos, take);
                w += take;
            }
            pos += take;
            c->sbody_left -= take;
            if (c->sbody_left == 0) server_message(e, c);
            continue;
        }
        if (c->watch == 2 && c->shdr_have == 0 && (buf[pos] == 'E' || buf[pos] == 'N')) {
            *cut = pos;
            return (int)w;
        }
        if (c->shdr_have == 0) { /* a reply to the question (not its ErrorResponse, nor a notice): dropped */
            entry_t *h = qhead(c);
            c->sdrop = h != NULL && h->inj && memchr("123DCnTsI", buf[pos], 9) != NULL;
        }
        size_t take = 5 - (size_t)c->shdr_have;
        if (take > len - pos) take = len - pos;
        memcpy(c->shdr + c->shdr_have, buf + pos, take);
        c->shdr_have += (int)take;
        if (!c->sdrop) {
            if (w != pos) memmove(buf + w, buf + pos, take);
            w += take;
        }
        pos += take;
        if (c->shdr_have == 5) {
            uint32_t ml = be32(c->shdr + 1);
            if (ml < 4) return -1;
            c->shdr_have = 0;
            c->stype = c->shdr[0];
            if (c->watch == 2 && watch_decided(c->stype, c->qlen ? qhead(c)->kind : 0)) c->watch = 0;
            server_header(c, c->stype);
            if (c->stype == 'S') pst_begin(c, ml);
            c->ebuf_have = 0;
            c->sbody_left = ml - 4;
            if (c->sbody_left == 0) server_message(e, c);
        }
    }
    return (int)w;
}

static void server_read(Engine *e, conn_t *c) {
    if (c->out[CLIENT].len || c->sheld != NULL) return;
    ssize_t n = recv(c->fd[SERVER], e->scratch, BUF_CAP, MSG_DONTWAIT);
    if (n == 0) {
        handback(e, c, CLOSED[SERVER], 0);
        return;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) handback(e, c, FAILED[SERVER], errno);
        return;
    }
    e->bytes_down += (unsigned long long)n;
    c->tick = 0;
    size_t cut;
    int relayed = parse_server(e, c, e->scratch, (size_t)n, &cut);
    if (relayed < 0) {
        handback(e, c, FAILED[SERVER], EPROTO);
        return;
    }
    if (cut < (size_t)n) { /* kept for Python (handed back once what comes before is sent) */
        c->sheld = malloc((size_t)n - cut);
        if (c->sheld == NULL) {
            handback(e, c, FAILED[SERVER], ENOMEM);
            return;
        }
        memcpy(c->sheld, e->scratch + cut, (size_t)n - cut);
        c->sheld_len = (size_t)n - cut;
    }
    if (relayed) send_to(e, c, CLIENT, e->scratch, (size_t)relayed);
}

/* After any event: forward client bytes a reply unblocked, re-arm, hand back when the time has come. */
static void settle(Engine *e, conn_t *c) {
    if (c->dead) return;
    if (c->stop_client && (c->inj_owed || c->promo_owed) && !c->inj_flushed) { /* to hand back: their replies now */
        static const unsigned char flush[5] = {'H', 0, 0, 0, 4};
        send_to(e, c, SERVER, flush, sizeof(flush));
        c->inj_flushed = 1;
        if (c->dead) return;
    }
    if (c->cin_len && !blocked(c) && c->out[SERVER].len == 0 && !c->cstream_left) {
        process_client(e, c, c->cin, c->cin_len);
        if (c->dead) return;
    }
    const char *reason = ready_to_hand_back(c);
    if (reason != NULL) {
        handback(e, c, reason, 0);
        return;
    }
    update_masks(e, c);
}

static void on_event(Engine *e, conn_t *c, int side, uint32_t events) {
    if (events & EPOLLERR) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(c->fd[side], SOL_SOCKET, SO_ERROR, &err, &len);
        handback(e, c, FAILED[side], err);
        return;
    }
    if ((events & EPOLLOUT) && c->out[side].len) flush_out(e, c, side);
    if (c->dead) return;
    if (events & EPOLLIN) {
        if (side == CLIENT) client_read(e, c);
        else server_read(e, c);
    } else if (events & EPOLLHUP) {
        handback(e, c, CLOSED[side], 0);
    }
    settle(e, c);
}

static void *run(void *arg) {
    Engine *e = arg;
    struct epoll_event events[64];
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (e->graveyard != NULL) {
            conn_t *c = e->graveyard;
            e->graveyard = c->next;
            free_conn(c);
        }
        int stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        int n = epoll_wait(e->epfd, events, 64, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        pthread_mutex_lock(&e->mu);
        for (int i = 0; i < n; i++) {
            end_t *end = events[i].data.ptr;
            if (end == NULL) {
                uint64_t v;
                ssize_t r = read(e->wakefd, &v, sizeof(v));
                (void)r;
                continue;
            }
            if (end->c->dead) continue;
            on_event(e, end->c, end->side, events[i].events);
        }
        if (e->notify) {
            uint64_t one = 1;
            ssize_t r = write(e->notifyfd, &one, sizeof(one));
            (void)r;
            e->notify = 0;
        }
        pthread_mutex_unlock(&e->mu);
    }
    return NULL;
}

/* ---- Python interface ---- */

static conn_t *find(Engine *e, long long id) {
    for (conn_t *c = e->conns; c != NULL; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

static PyObject *bytes_or_none(const unsigned char *data, size_t len) {
    if (data == NULL) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)len);
}

/* [(name, idx, text or None, Bind parameters or None)]: idx >= 0 is Python's own Statement, else the text
 * prepared here; the parameters of a portal of a recorded read. */
static PyObject *table_list(table_t *t) {
    PyObject *list = PyList_New(t->n);
    if (list == NULL) return NULL;
    for (int i = 0; i < t->n; i++) {
        stmt_t *st = t->v[i].s;
        named_t *slot = &t->v[i];
        PyObject *item;
        PyObject *params = bytes_or_none(slot->params, slot->plen);
        if (params == NULL) item = NULL;
        else if (st->idx >= 0)
            item = Py_BuildValue("(y#lON)", slot->name, (Py_ssize_t)slot->len, st->idx, Py_None, params);
        else
            item = Py_BuildValue("(y#ly#N)", slot->name, (Py_ssize_t)slot->len, -1L, st->text,
                                 (Py_ssize_t)st->len, params);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* A done read record: (ref, rows or None, wall-clock end, duration in µs, Bind parameters or None, its
 * transaction's number and id, its own text or None). */
static PyObject *read_tuple(const rec_t *rec) {
    PyObject *rows = rec->rows >= 0 ? PyLong_FromLongLong(rec->rows) : Py_NewRef(Py_None);
    PyObject *params = bytes_or_none(rec_params(rec), rec->plen);
    PyObject *text = bytes_or_none(rec->text, rec->tlen);
    if (rows == NULL || params == NULL || text == NULL) {
        Py_XDECREF(rows);
        Py_XDECREF(params);
        Py_XDECREF(text);
        return NULL;
    }
    return Py_BuildValue("(lNdLNLKN)", rec->ref, rows, rec->wall, rec->duration_us, params, rec->txn, rec->xid,
                         text);
}

/* Append the done records of recs[0..n) to list (the failed ones are skipped). */
static int reads_append(PyObject *list, const rec_t *recs, long long n) {
    for (long long i = 0; i < n; i++) {
        if (recs[i].state != 1) continue;
        PyObject *t = read_tuple(&recs[i]);
        if (t == NULL || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            return -1;
        }
        Py_DECREF(t);
    }
    return 0;
}

#define NO_TXN LLONG_MIN /* encode_records' open_txn: no transaction's records are held back */

/* Whether C writes a done record's row: it has a head, and its operation is known (an operation id in force,
 * or its transaction ended: the open one's wait in Python's TxnReads.held for its end). */
static const rhead_t *row_head(const enc_t *en, const rec_t *rec, long long open_txn) {
    const rhead_t *h = rec_head(en, rec);
    return h != NULL && (en->operation != NULL || rec->txn != open_txn) ? h : NULL;
}

/* The done records of v[0..n) as one dictionary run (put_entry), in a new bytes object, and in *count how many;
 * the others (no head, or of open_txn) appended to reads as tuples, in order. NULL with an exception set on
 * failure. */
static PyObject *encode_records(const enc_t *en, const rec_t *v, long long n, long long open_txn,
                                PyObject *reads, long long *count) {
    /* By a head's slot (head_slot): its index in the run + 1 (0: not in it yet); then the slots by index; then
     * each record's slot (-1: no head, its record goes as a tuple). */
    long slots = en != NULL ? en->nstmts + en->ndecs : 0;
    long *index = en != NULL ? calloc(2 * (size_t)slots + (size_t)n + 1, sizeof(long)) : NULL;
    if (en != NULL && index == NULL) return PyErr_NoMemory();
    long *order = index + slots, *slot_of = order + slots;
    size_t bound = 2 + 4 + (en != NULL ? en->rlen : 0) + 2;
    size_t op = en != NULL && en->operation != NULL && en->olen > MAX_OP_FIELD ? en->olen : MAX_OP_FIELD;
    int heads = 0;
    for (long long i = 0; en != NULL && i < n; i++) {
        const rhead_t *h = row_head(en, &v[i], open_txn);
        slot_of[i] = h != NULL ? head_slot(en, &v[i]) : -1;
        if (h == NULL) continue;
        if (index[slot_of[i]] == 0) {
            order[heads] = slot_of[i];
            index[slot_of[i]] = ++heads;
            bound += h->len + 2;
        }
        bound += ENTRY_FIXED + op + v[i].plen + (h->shape ? 4 + v[i].tlen : 0);
    }
    PyObject *run = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(heads ? bound : 0));
    if (run == NULL) {
        free(index);
        return NULL;
    }
    unsigned char *start = (unsigned char *)PyBytes_AS_STRING(run), *p = start;
    *count = 0;
    if (heads) { /* the header and the statements, in the order of their first reads */
        p = put16(p, RUN_MARK);
        p = put_field(p, en->read_ids, en->rlen);
        p = put16(p, heads);
        for (int k = 0; k < heads; k++) p = put_statement(p, slot_head(en, order[k]));
    }
    int last_kind = 0;
    unsigned long long last = 0;
    for (long long i = 0; i < n; i++) {
        if (en != NULL && slot_of[i] >= 0) {
            long slot = slot_of[i];
            p = put_entry(en, slot_head(en, slot), (int)index[slot] - 1, &v[i], &last_kind, &last, p);
            (*count)++;
        } else if (reads_append(reads, &v[i], 1) < 0) {
            free(index);
            Py_DECREF(run);
            return NULL;
        }
    }
    free(index);
    if (_PyBytes_Resize(&run, (Py_ssize_t)(p - start)) < 0) return NULL;
    return run;
}

/* The records of a hand-back: the done ones as take_reads gives them (a run in *rows, *count of them, with
 * the connection's encoder; tuples in *done for the rest, those of the open transaction among them when its
 * operation is its own), and (position in the owed replies, ref, started, parameters, own text) of those the
 * owed replies will finish (Python's relay takes them over). A connection that closes hands back up to a
 * ring's records at once: C writes their rows, as it does at a take. */
static int handback_reads(handback_t *h, PyObject **done, PyObject **owed, PyObject **rows, long long *count) {
    *done = PyList_New(0);
    *owed = PyList_New(0);
    *rows = NULL;
    *count = 0;
    if (*done == NULL || *owed == NULL) return -1;
    ring_t *r = &h->reads;
    if (r->v == NULL) return (*rows = PyBytes_FromStringAndSize(NULL, 0)) == NULL ? -1 : 0;
    double to_wall = wall_now() - now();
    /* The done records by value, in order (the ring keeps owning their parameters and texts). */
    rec_t *v = malloc(sizeof(rec_t) * (size_t)(r->end - r->base + 1));
    if (v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    long long n = 0;
    for (long long seq = r->base; seq < r->end; seq++) {
        rec_t *rec = &r->v[seq % READ_CAP];
        if (rec->state == 1) {
            rec->wall += to_wall;
            v[n++] = *rec;
        }
    }
    *rows = encode_records(h->enc, v, n, h->txn, *done, count);
    free(v);
    if (*rows == NULL) return -1;
    for (long long seq = r->base; seq < r->end; seq++) {
        rec_t *rec = &r->v[seq % READ_CAP];
        if (rec->state == 0 && h->qrec != NULL) {
            for (int i = 0; h->kinds[i]; i++) {
                if (h->qrec[i] != seq) continue;
                PyObject *params = bytes_or_none(rec_params(rec), rec->plen);
                PyObject *text = params ? bytes_or_none(rec->text, rec->tlen) : NULL;
                PyObject *t = text ? Py_BuildValue("(ildNN)", i, rec->ref, rec->started, params, text) : NULL;
                if (text == NULL) Py_XDECREF(params);
                if (t == NULL || PyList_Append(*owed, t) < 0) {
                    Py_XDECREF(t);
                    return -1;
                }
                Py_DECREF(t);
            }
        }
    }
    return 0;
}

/* [(name number, prepared)]: the promotions given at adoption, in order, as they are now. */
static PyObject *promos_list(const promo_t *v, int n) {
    PyObject *list = PyList_New(n);
    for (int i = 0; list != NULL && i < n; i++) {
        PyObject *item = Py_BuildValue("(iO)", v[i].no, v[i].state == PROMO_PREPARED ? Py_True : Py_False);
        if (item == NULL) Py_CLEAR(list);
        else PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *handback_tuple(handback_t *h) {
    char status[2] = {h->status, 0};
    PyObject *data = PyBytes_FromStringAndSize((const char *)h->data, (Py_ssize_t)h->len);
    PyObject *stmts = table_list(&h->stmts), *portals = table_list(&h->portals);
    PyObject *done = NULL, *owed = NULL, *rows = NULL;
    long long count = 0;
    PyObject *batch = bytes_or_none(h->batch, h->blen);
    PyObject *sdata = PyBytes_FromStringAndSize((const char *)h->sdata, (Py_ssize_t)h->slen);
    PyObject *promos = promos_list(h->promos, h->npromos);
    PyObject *pst = h->pst_lost ? (Py_INCREF(Py_None), Py_None)
                                : PyBytes_FromStringAndSize((const char *)h->pst, (Py_ssize_t)h->pst_len);
    named_t *unnamed = table_find(&h->stmts, (const unsigned char *)"", 0);
    if (data == NULL || stmts == NULL || portals == NULL || batch == NULL || sdata == NULL || promos == NULL ||
        pst == NULL || handback_reads(h, &done, &owed, &rows, &count) < 0) {
        Py_XDECREF(pst);
        Py_XDECREF(promos);
        Py_XDECREF(data);
        Py_XDECREF(stmts);
        Py_XDECREF(portals);
        Py_XDECREF(batch);
        Py_XDECREF(sdata);
        Py_XDECREF(done);
        Py_XDECREF(owed);
        Py_XDECREF(rows);
        return NULL;
    }
    return Py_BuildValue("(LsisiiNsiiNNkNNLiiKNNNiiOiNLN)", h->id, h->reason, h->err, status, h->inflight,
                         h->untaken, data, h->kinds, h->mid_batch, h->skip, stmts, portals, h->taken, done, owed,
                         h->txn, h->txn_reads, h->txn_wrote, h->txn_xid, batch, sdata, promos, h->promo_count,
                         h->dealloc, h->suspect ? Py_True : Py_False, unnamed != NULL ? unnamed->s->alias : 0, rows,
                         count, pst);
}

static void free_handback(handback_t *h) {
    table_free(&h->stmts);
    table_free(&h->portals);
    ring_free(&h->reads);
    enc_unref(h->enc);
    free(h->qrec);
    free(h->data);
    free(h->batch);
    free(h->sdata);
    free(h->pst);
    promos_free(h->promos, h->npromos);
    free(h);
}

/* Write slots given by Python (a sequence of ints < MAX_WRITE_SLOTS, at most STMT_WRITES). */
static int load_slots(PyObject *items, unsigned char *n, unsigned short *slots) {
    PyObject *seq = PySequence_Fast(items, "expected a sequence of write slots");
    if (seq == NULL) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count > STMT_WRITES) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many write slots");
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v < 0 || v >= MAX_WRITE_SLOTS) {
            Py_DECREF(seq);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad write slot");
            return -1;
        }
        slots[i] = (unsigned short)v;
    }
    *n = (unsigned char)count;
    Py_DECREF(seq);
    return 0;
}

/* A decision's rewritten text (None, or bytes: a 'Q' decision's, no read record, no NUL, short enough to be
 * sent and watched as one Query: BUF_CAP): *sql NULL for none. 0, or -1 with ValueError set. */
static int load_rewritten(PyObject *o, unsigned char type, int records, const char **sql, Py_ssize_t *n) {
    *sql = NULL;
    *n = 0;
    if (o == Py_None) return 0;
    if (!PyBytes_Check(o) || type != 'Q' || records) {
        PyErr_SetString(PyExc_ValueError, "bad rewritten text");
        return -1;
    }
    *sql = PyBytes_AS_STRING(o);
    *n = PyBytes_GET_SIZE(o);
    if ((size_t)*n + 6 > BUF_CAP || memchr(*sql, 0, (size_t)*n) != NULL) {
        PyErr_SetString(PyExc_ValueError, "bad rewritten text");
        return -1;
    }
    return 0;
}

/* A decision's key and rewritten text into one allocation (d->key, d->sql after it). -1: no memory. */
static int decision_keep(decision_t *d, const char *key, Py_ssize_t len, const char *sql, Py_ssize_t sql_len) {
    d->key = malloc((size_t)len + (size_t)sql_len + 1);
    if (d->key == NULL) return -1;
    memcpy(d->key, key, (size_t)len);
    d->sql = sql != NULL ? d->key + len : NULL;
    d->sql_len = (size_t)sql_len;
    if (sql != NULL) memcpy(d->sql, sql, (size_t)sql_len);
    return 0;
}

/* Decisions at adoption: [(type + text, kind, slots, recorded read, rerun, promotion, rewritten text or None)];
 * a read record names a decision by its index in this list. A 'U' decision (an unnamed Parse Python promotes: the key is the
 * Parse's body after its empty name, the text and its parameter types) names its promotion (an index into the
 * npromos loaded before). */
/* Loads the entries of items from start on into t (those before are its base's). */
static int decisions_load(Engine *e, dtable_t *t, PyObject *items, int npromos, Py_ssize_t start) {
    PyObject *seq = PySequence_Fast(items, "expected a sequence of (key, kind, slots)");
    if (seq == NULL) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count > MAX_DECISIONS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many decisions for the fast relay");
        return -1;
    }
    size_t cap = 16;
    while (cap < 2 * (size_t)(count - start)) cap *= 2;
    t->v = calloc(cap, sizeof(decision_t));
    if (t->v == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    t->cap = cap;
    for (Py_ssize_t i = start; i < count; i++) {
        const char *key, *sql;
        Py_ssize_t len, sql_len;
        int kind, records, rerun, promo;
        PyObject *slots, *rewritten;
        decision_t d = {0};
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "y#iOppiO", &key, &len, &kind, &slots, &records,
                              &rerun, &promo, &rewritten) ||
            load_slots(slots, &d.nslots, d.slots) < 0 ||
            load_rewritten(rewritten, len > 0 ? (unsigned char)key[0] : 0, records, &sql, &sql_len) < 0) {
            Py_DECREF(seq);
            return -1;
        }
        if (len < 1 || strchr("QPqpU", key[0]) == NULL || key[0] == 0 || kind < 0 || kind >= e->nkinds ||
            (key[0] == 'U') != (promo >= 0) || promo >= npromos) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "bad decision");
            return -1;
        }
        d.hash = fnv1a((unsigned char)key[0], (const unsigned char *)key + 1, (size_t)len - 1);
        d.len = (size_t)len;
        d.kind = kind;
        d.read = records ? -(long)(i + 1) : NO_READ;
        d.rerun = rerun;
        d.promo = promo;
        if (decision_find(t, (unsigned char)key[0], (const unsigned char *)key + 1, (size_t)len - 1) != NULL)
            continue;
        if (decision_keep(&d, key, len, sql, sql_len) < 0) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        if (key[0] == 'q' || key[0] == 'p') t->shapes++;
        if (key[0] == 'U') t->promos++;
        size_t j = d.hash & (cap - 1);
        while (t->v[j].key != NULL) j = (j + 1) & (cap - 1);
        t->v[j] = d;
    }
    Py_DECREF(seq);
    return 0;
}

/* How many first entries items shares with the list last loaded (the same row objects: Python makes each
 * row once, Decisions._rows), when it extends that list and its table may take one more level; else 0. */
static Py_ssize_t extends_last(Engine *e, PyObject *items) {
    PyObject *last = e->dec_items;
    if (last == NULL || e->dec_table == NULL || e->dec_table->depth + 1 >= MAX_CHAIN || !PyList_Check(items) ||
        !PyList_Check(last))
        return 0;
    Py_ssize_t n = PyList_GET_SIZE(last);
    if (n == 0 || PyList_GET_SIZE(items) <= n) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyList_GET_ITEM(items, i) != PyList_GET_ITEM(last, i)) return 0;
    return n;
}

/* The table of a list of decisions: the one loaded for the same list object at an earlier adoption (Python
 * gives the connections of a database one list while its decisions are unchanged: Decisions.export), else
 * loaded now (~1 µs per entry: a 1024-entry list cost each adoption ~1 ms) and kept for the next. NULL: an
 * exception is set. */
static dtable_t *decisions_for(Engine *e, PyObject *items, int npromos) {
    if (items == e->dec_items && e->dec_table != NULL) return dtable_ref(e->dec_table);
    dtable_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    t->refs = 1;
    Py_ssize_t start = extends_last(e, items);
    if (start > 0) {
        t->base = dtable_ref(e->dec_table);
        t->depth = t->base->depth + 1;
        t->shapes = t->base->shapes;
    }
    if (decisions_load(e, t, items, npromos, start) < 0) {
        dtable_unref(t);
        return NULL;
    }
    if (t->promos == 0) { /* (the list is held, so no other list can take its address while it is kept) */
        Py_INCREF(items);
        Py_XDECREF(e->dec_items);
        dtable_unref(e->dec_table);
        e->dec_items = items;
        e->dec_table = dtable_ref(t);
    }
    return t;
}

/* One decision Python answered (a row as decisions_load takes it, for a Query: key type 'Q' or 'q', no read
 * record, no promotion; a rewritten text only with 'Q') into the connection's own table of them (conn_t.extra),
 * which grows by doubling and starts again empty once it holds MAX_ANSWERED. */
static int answered_add(Engine *e, conn_t *c, PyObject *row) {
    const char *key, *sql;
    Py_ssize_t len, sql_len;
    int kind, records, rerun, promo;
    PyObject *slots, *rewritten;
    decision_t d = {0};
    if (!PyArg_ParseTuple(row, "y#iOppiO", &key, &len, &kind, &slots, &records, &rerun, &promo, &rewritten) ||
        load_slots(slots, &d.nslots, d.slots) < 0 ||
        load_rewritten(rewritten, len > 0 ? (unsigned char)key[0] : 0, records, &sql, &sql_len) < 0)
        return -1;
    if (len < 1 || (key[0] != 'Q' && key[0] != 'q') || kind < 0 || kind >= e->nkinds || records || promo != -1) {
        PyErr_SetString(PyExc_ValueError, "bad answered decision");
        return -1;
    }
    dtable_t *t = c->extra;
    if (t != NULL && decision_find(t, (unsigned char)key[0], (const unsigned char *)key + 1, (size_t)len - 1))
        return 0;
    size_t used = 0;
    if (t != NULL)
        for (size_t i = 0; i < t->cap; i++) used += t->v[i].key != NULL;
    if (t == NULL || used >= MAX_ANSWERED || 2 * (used + 1) > t->cap) { /* a new table: larger, or empty again */
        size_t cap = t == NULL || used >= MAX_ANSWERED ? 16 : 2 * t->cap;
        dtable_t *n = calloc(1, sizeof(*n));
        if (n == NULL || (n->v = calloc(cap, sizeof(decision_t))) == NULL) {
            free(n);
            PyErr_NoMemory();
            return -1;
        }
        n->cap = cap;
        n->refs = 1;
        for (size_t i = 0; t != NULL && used < MAX_ANSWERED && i < t->cap; i++) {
            if (t->v[i].key == NULL) continue;
            size_t j = t->v[i].hash & (cap - 1);
            while (n->v[j].key != NULL) j = (j + 1) & (cap - 1);
            n->v[j] = t->v[i];
            t->v[i].key = NULL; /* (moved) */
        }
        n->shapes = t != NULL && used < MAX_ANSWERED ? t->shapes : 0;
        dtable_unref(t);
        c->extra = t = n;
    }
    d.hash = fnv1a((unsigned char)key[0], (const unsigned char *)key + 1, (size_t)len - 1);
    d.len = (size_t)len;
    d.kind = kind;
    d.read = NO_READ;
    d.rerun = rerun;
    d.promo = -1;
    if (decision_keep(&d, key, len, sql, sql_len) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (key[0] == 'q') t->shapes++;
    size_t j = d.hash & (t->cap - 1);
    while (t->v[j].key != NULL) j = (j + 1) & (t->cap - 1);
    t->v[j] = d;
    return 0;
}

/* Promotions at adoption: [(rewritten text, parameter types as in a Parse, name number, prepared)]. */
static int promos_load(conn_t *c, PyObject *items) {
    PyObject *seq = PySequence_Fast(items, "expected a sequence of (sql, types, number, prepared)");
    if (seq == NULL) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count > MAX_PROMOS || (count && (c->promos = calloc((size_t)count, sizeof(promo_t))) == NULL)) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many promotions for the fast relay");
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *sql, *types;
        Py_ssize_t slen, tlen;
        int no, prepared;
        promo_t *pr = &c->promos[i];
        c->npromos = (int)i + 1;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "y#y#ip", &sql, &slen, &types, &tlen, &no,
                              &prepared)) {
            Py_DECREF(seq);
            return -1;
        }
        pr->sql = malloc(slen ? (size_t)slen : 1);
        pr->types = malloc(tlen ? (size_t)tlen : 1);
        if (pr->sql == NULL || pr->types == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(pr->sql, sql, (size_t)slen);
        memcpy(pr->types, types, (size_t)tlen);
        pr->sql_len = (size_t)slen;
        pr->types_len = (size_t)tlen;
        pr->no = no;
        pr->state = prepared && no > 0 ? PROMO_PREPARED : PROMO_NONE;
    }
    Py_DECREF(seq);
    return 0;
}

/* Python's statements (or portals) at adoption: [(name, idx, kind, pyonly, write slots, recorded read, rerun)]. */
static int table_load(Engine *e, table_t *t, PyObject *items) {
    PyObject *seq = PySequence_Fast(items, "expected a sequence of (name, idx, kind, pyonly, slots)");
    if (seq == NULL) return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        const char *name;
        Py_ssize_t len;
        long idx;
        int kind, pyonly, records, rerun;
        PyObject *slots;
        unsigned char nslots = 0;
        unsigned short slot[STMT_WRITES];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "y#lipOpp", &name, &len, &idx, &kind, &pyonly,
                              &slots, &records, &rerun) ||
            load_slots(slots, &nslots, slot) < 0) {
            Py_DECREF(seq);
            return -1;
        }
        if (kind < 0 || kind >= e->nkinds) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "bad kind index");
            return -1;
        }
        stmt_t *st = stmt_new(kind, pyonly, idx, NULL, 0);
        if (st != NULL) {
            st->nslots = nslots;
            memcpy(st->slots, slot, sizeof(slot));
            if (records && idx >= 0) st->read = idx; /* its Executes are reads of a recorded session */
            st->rerun = rerun;
        }
        if (st == NULL || table_set(t, (const unsigned char *)name, (size_t)len, st) < 0) {
            free(st);
            Py_DECREF(seq);
            /* ValueError: the caller keeps the connection in Python (more than MAX_NAMES, or no memory) */
            PyErr_SetString(PyExc_ValueError, "too many prepared statements or portals for the fast relay");
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* One message: type, length, body. */
static size_t put_message(unsigned char *out, char type, const char *body, size_t n) {
    uint32_t len = (uint32_t)n + 4;
    out[0] = (unsigned char)type;
    out[1] = (unsigned char)(len >> 24);
    out[2] = (unsigned char)(len >> 16);
    out[3] = (unsigned char)(len >> 8);
    out[4] = (unsigned char)len;
    memcpy(out + 5, body, n);
    return n + 5;
}

/* The question's messages, as InjectedBatches.queue_query sends them: Close S, Parse, Bind and Execute of the portal
 * of the same name, Close P, Close S. */
static size_t xact_messages(unsigned char *out) {
    static const char close_s[] = "S" XACT_NAME;
    static const char close_p[] = "P" XACT_NAME;
    static const char parse[] = XACT_NAME "\0" XACT_SQL "\0\0";         /* (+ NUL: no parameter types) */
    static const char bind[] = XACT_NAME "\0" XACT_NAME "\0\0\0\0\0\0"; /* (+ NUL: no formats, values) */
    static const char execute[] = XACT_NAME "\0\0\0\0";                 /* (+ NUL: no row limit) */
    size_t n = 0;
    n += put_message(out + n, 'C', close_s, sizeof(close_s));
    n += put_message(out + n, 'P', parse, sizeof(parse));
    n += put_message(out + n, 'B', bind, sizeof(bind));
    n += put_message(out + n, 'E', execute, sizeof(execute));
    n += put_message(out + n, 'C', close_p, sizeof(close_p));
    n += put_message(out + n, 'C', close_s, sizeof(close_s));
    return n;
}
_Static_assert(6 * 5 + 3 * (sizeof(XACT_NAME) + 1) + 3 * sizeof(XACT_NAME) + sizeof(XACT_SQL) + 2 + 6 + 4 <= 256,
               "Engine.xact holds the question");

static int engine_init(Engine *e, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"words", "kinds", "utility", "other", "buckets", NULL};
    PyObject *words, *buckets;
    int nkinds, utility, other;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OiiiO", kwlist, &words, &nkinds, &utility, &other, &buckets))
        return -1;
    if (e->started) {
        PyErr_SetString(PyExc_RuntimeError, "Engine already initialised");
        return -1;
    }
    if (nkinds < 1 || nkinds > MAX_KINDS || utility < 0 || utility >= nkinds || other < 0 || other >= nkinds) {
        PyErr_SetString(PyExc_ValueError, "bad kind indexes");
        return -1;
    }
    e->xact_len = xact_messages(e->xact);
    e->nkinds = nkinds;
    e->kind_utility = utility;
    e->kind_other = other;
    PyObject *seq = PySequence_Fast(words, "words must be a sequence of (bytes, int)");
    if (seq == NULL) return -1;
    Py_ssize_t nw = PySequence_Fast_GET_SIZE(seq);
    if (nw > MAX_WORDS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many words");
        return -1;
    }
    for (Py_ssize_t i = 0; i < nw; i++) {
        const char *w;
        Py_ssize_t wl;
        int kind;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "y#i", &w, &wl, &kind)) {
            Py_DECREF(seq);
            return -1;
        }
        if (wl < 1 || wl >= (Py_ssize_t)sizeof(e->words[0].word) || kind < 0 || kind >= nkinds) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "bad word");
            return -1;
        }
        memcpy(e->words[i].word, w, (size_t)wl);
        e->words[i].len = (int)wl;
        e->words[i].kind = kind;
    }
    e->nwords = (int)nw;
    Py_DECREF(seq);
    seq = PySequence_Fast(buckets, "buckets must be a sequence of floats");
    if (seq == NULL) return -1;
    Py_ssize_t nb = PySequence_Fast_GET_SIZE(seq);
    if (nb > MAX_BUCKETS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many buckets");
        return -1;
    }
    for (Py_ssize_t i = 0; i < nb; i++) {
        double b = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (b == -1.0 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        e->bounds[i] = b;
    }
    e->nbounds = (int)nb;
    Py_DECREF(seq);

    e->scratch = malloc(BUF_CAP);
    e->shape = malloc(BUF_CAP);
    if (e->scratch == NULL || e->shape == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    pthread_mutex_init(&e->mu, NULL);
    e->epfd = epoll_create1(EPOLL_CLOEXEC);
    e->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    e->notifyfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->epfd < 0 || e->wakefd < 0 || e->notifyfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->wakefd, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    /* The thread takes no signals: they belong to the interpreter's main thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&e->thread, NULL, run, e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    e->started = 1;
    return 0;
}

static void engine_shutdown(Engine *e) {
    if (!e->started) return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_mutex_unlock(&e->mu);
    uint64_t one = 1;
    ssize_t r = write(e->wakefd, &one, sizeof(one));
    (void)r;
    Py_BEGIN_ALLOW_THREADS pthread_join(e->thread, NULL);
    Py_END_ALLOW_THREADS e->started = 0;
    while (e->conns != NULL) detach(e, e->conns);
    while (e->graveyard != NULL) {
        conn_t *c = e->graveyard;
        e->graveyard = c->next;
        free_conn(c);
    }
    while (e->hb_head != NULL) {
        handback_t *h = e->hb_head;
        e->hb_head = h->next;
        free_handback(h);
    }
    e->hb_tail = NULL;
    while (e->rq_head != NULL) {
        request_t *r = e->rq_head;
        e->rq_head = r->next;
        free(r->text);
        free(r);
    }
    e->rq_tail = NULL;
    close(e->epfd);
    close(e->wakefd);
    close(e->notifyfd);
    e->epfd = e->wakefd = e->notifyfd = -1;
}

static void engine_dealloc(Engine *e) {
    engine_shutdown(e);
    Py_CLEAR(e->dec_items);
    dtable_unref(e->dec_table);
    e->dec_table = NULL;
    free(e->scratch);
    free(e->shape);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *engine_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Engine *e = (Engine *)type->tp_alloc(type, 0);
    if (e != NULL) e->epfd = e->wakefd = e->notifyfd = -1;
    return (PyObject *)e;
}

#define CHECK_STARTED(e)                                                                                 \
    if (!(e)->started) {                                                                                 \
        PyErr_SetString(PyExc_RuntimeError, "the fast relay is closed");                                 \
        return NULL;                                                                                     \
    }

static PyObject *engine_fileno(Engine *e, PyObject *unused) {
    CHECK_STARTED(e);
    return PyLong_FromLong(e->notifyfd);
}

/* Promotions.alias at adoption: the unnamed statement Python has stands for the proxy's name number alias
 * (0: none), of promotion alias_promo (-1: none of those given). */
static int promos_alias(conn_t *c, int alias, int alias_promo) {
    if (alias == 0) return 0;
    named_t *unnamed = table_find(&c->stmts, (const unsigned char *)"", 0);
    if (unnamed == NULL || alias < 0 || alias_promo >= c->npromos) {
        PyErr_SetString(PyExc_ValueError, "an alias without its unnamed statement");
        return -1;
    }
    unnamed->s->alias = alias;
    unnamed->s->promo = alias_promo;
    return 0;
}

/* A copy of a bytes object's contents (NULL with an exception set on failure). */
static unsigned char *bytes_copy(PyObject *b, size_t *len) {
    char *data;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(b, &data, &n) < 0) return NULL;
    unsigned char *out = malloc(n > 0 ? (size_t)n : 1);
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(out, data, (size_t)n);
    *len = (size_t)n;
    return out;
}

/* adopt's encode: (session field, operation field or None, read_ids, [(ref, head, shape: a shape's decision,
 * whose records carry their own text)]). */
static enc_t *enc_load(PyObject *spec) {
    PyObject *session, *operation, *read_ids, *heads;
    if (!PyArg_ParseTuple(spec, "SOSO", &session, &operation, &read_ids, &heads)) return NULL;
    PyObject *seq = PySequence_Fast(heads, "expected a sequence of read heads");
    if (seq == NULL) return NULL;
    enc_t *en = calloc(1, sizeof(*en));
    if (en == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    en->refs = 1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) { /* (sizes first: refs index the two arrays) */
        long ref;
        PyObject *head;
        int shape;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "lSp", &ref, &head, &shape)) goto fail;
        if (ref >= 0 && ref + 1 > en->nstmts) en->nstmts = ref + 1;
        if (ref < 0 && -ref > en->ndecs) en->ndecs = -ref;
    }
    if ((en->nstmts && (en->stmts = calloc((size_t)en->nstmts, sizeof(rhead_t))) == NULL) ||
        (en->ndecs && (en->decs = calloc((size_t)en->ndecs, sizeof(rhead_t))) == NULL)) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long ref;
        PyObject *head;
        int shape;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "lSp", &ref, &head, &shape)) goto fail;
        rhead_t *h = ref >= 0 ? &en->stmts[ref] : &en->decs[-(ref + 1)];
        if (h->head != NULL) continue;
        if ((h->head = bytes_copy(head, &h->len)) == NULL) goto fail;
        h->shape = shape;
    }
    if ((en->session = bytes_copy(session, &en->slen)) == NULL ||
        (en->read_ids = bytes_copy(read_ids, &en->rlen)) == NULL)
        goto fail;
    if (operation != Py_None && (en->operation = bytes_copy(operation, &en->olen)) == NULL) goto fail;
    Py_DECREF(seq);
    return en;
fail:
    Py_DECREF(seq);
    enc_unref(en);
    return NULL;
}

static PyObject *engine_adopt(Engine *e, PyObject *args) {
    long long id;
    int cfd, sfd;
    unsigned long long max_message;
    PyObject *stmts = NULL, *portals = NULL, *decisions = NULL, *promos = NULL, *encode = Py_None;
    int tagged = 0, record = 0, resolve = -1, txn_reads = 0, txn_wrote = 0;
    int promo_count = 0, promo_max = 0, alias = 0, alias_promo = -1, ask = 0, status = 'I';
    long long txn = 0;
    if (!PyArg_ParseTuple(args, "LiiK|OOpOpiLipOiiiiOpC", &id, &cfd, &sfd, &max_message, &stmts, &portals,
                          &tagged, &decisions, &record, &resolve, &txn, &txn_reads, &txn_wrote, &promos,
                          &promo_count, &promo_max, &alias, &alias_promo, &encode, &ask, &status))
        return NULL;
    if (status != 'I' && (status != 'T' || !tagged || record)) { /* (a session inside a block: Relay.at_rest) */
        PyErr_SetString(PyExc_ValueError, "a connection is adopted with status I, or T in a session not recorded");
        return NULL;
    }
    CHECK_STARTED(e);
    conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) return PyErr_NoMemory();
    c->dec = &NO_DECISIONS;
    c->tagged = tagged;
    c->may_ask = tagged && !record && ask; /* (a recorded read names its decision by its index in the list given) */
    c->resolve = record ? resolve : -1;
    c->txn = txn;
    c->txn_reads = txn_reads;
    c->txn_wrote = txn_wrote;
    c->cur_rec = -1;
    if (record && (c->reads.v = malloc(sizeof(rec_t) * READ_CAP)) == NULL) {
        free_conn(c);
        return PyErr_NoMemory();
    }
    c->promo_count = promo_count;
    c->promo_max = promo_max;
    if (record && encode != Py_None && (c->enc = enc_load(encode)) == NULL) {
        free_conn(c);
        return NULL;
    }
    if ((stmts != NULL && table_load(e, &c->stmts, stmts) < 0) ||
        (portals != NULL && table_load(e, &c->portals, portals) < 0) ||
        (promos != NULL && promos != Py_None && promos_load(c, promos) < 0) ||
        (decisions != NULL && (c->dec = decisions_for(e, decisions, c->npromos)) == NULL) ||
        promos_alias(c, alias, alias_promo) < 0) {
        free_conn(c);
        return NULL;
    }
    c->id = id;
    c->fd[CLIENT] = cfd;
    c->fd[SERVER] = sfd;
    c->max_message = max_message;
    c->status = (char)status;
    c->untaken = -1;
    for (int side = 0; side < 2; side++) {
        c->end[side].c = c;
        c->end[side].side = side;
        c->mask[side] = EPOLLIN;
    }
    pthread_mutex_lock(&e->mu);
    if (find(e, id) != NULL) {
        pthread_mutex_unlock(&e->mu);
        free_conn(c);
        PyErr_Format(PyExc_ValueError, "connection %lld is already on the fast relay", id);
        return NULL;
    }
    for (int side = 0; side < 2; side++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->end[side]};
        if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, c->fd[side], &ev) < 0) {
            int err = errno;
            if (side == SERVER) epoll_ctl(e->epfd, EPOLL_CTL_DEL, c->fd[CLIENT], NULL);
            pthread_mutex_unlock(&e->mu);
            free_conn(c);
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    }
    c->next = e->conns;
    e->conns = c;
    e->nconns++;
    pthread_mutex_unlock(&e->mu);
    Py_RETURN_NONE;
}

/* Ask for the connection back at its next idle point: returns the hand-back now if it is idle, else None
 * (it comes through take_handbacks). */
static PyObject *engine_recall(Engine *e, PyObject *args) {
    long long id;
    if (!PyArg_ParseTuple(args, "L", &id)) return NULL;
    CHECK_STARTED(e);
    handback_t *h = NULL;
    pthread_mutex_lock(&e->mu);
    conn_t *c = find(e, id);
    if (c != NULL) {
        c->recall = 1;
        const char *reason = ready_to_hand_back(c);
        if (reason != NULL) h = make_handback(e, c, reason, 0);
        else update_masks(e, c);
    }
    pthread_mutex_unlock(&e->mu);
    if (h == NULL) Py_RETURN_NONE;
    PyObject *t = handback_tuple(h);
    free_handback(h);
    return t;
}

/* Take the connection out at once, whatever its state (Python is closing it). */
static PyObject *engine_release(Engine *e, PyObject *args) {
    long long id;
    if (!PyArg_ParseTuple(args, "L", &id)) return NULL;
    CHECK_STARTED(e);
    pthread_mutex_lock(&e->mu);
    conn_t *c = find(e, id);
    if (c != NULL) detach(e, c);
    pthread_mutex_unlock(&e->mu);
    return PyBool_FromLong(c != NULL);
}

static PyObject *engine_take_handbacks(Engine *e, PyObject *unused) {
    CHECK_STARTED(e);
    uint64_t v;
    ssize_t r = read(e->notifyfd, &v, sizeof(v));
    (void)r;
    pthread_mutex_lock(&e->mu);
    handback_t *h = e->hb_head;
    e->hb_head = e->hb_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    PyObject *list = PyList_New(0);
    while (h != NULL) {
        handback_t *next = h->next;
        if (list != NULL) {
            PyObject *t = handback_tuple(h);
            if (t == NULL || PyList_Append(list, t) < 0) Py_CLEAR(list);
            Py_XDECREF(t);
        }
        free_handback(h);
        h = next;
    }
    return list;
}

/* [(conn_id, request number, Query text)]: the texts C asks Python to decide (answer each with answer()). */
static PyObject *engine_take_requests(Engine *e, PyObject *unused) {
    CHECK_STARTED(e);
    pthread_mutex_lock(&e->mu);
    request_t *r = e->rq_head;
    e->rq_head = e->rq_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    PyObject *list = PyList_New(0);
    while (r != NULL) {
        request_t *next = r->next;
        if (list != NULL) {
            PyObject *t = Py_BuildValue("(LKy#)", r->id, r->seq, (const char *)r->text, (Py_ssize_t)r->len);
            if (t == NULL || PyList_Append(list, t) < 0) Py_CLEAR(list);
            Py_XDECREF(t);
        }
        free(r->text);
        free(r);
        r = next;
    }
    return list;
}

/* answer(conn_id, request, decision or None) -> bool: Python's answer to a request. With a decision (a row as
 * at adoption) C takes the Query by it; with None it hands the connection back at that Query, as it did
 * before asking. False: the request is void (the connection was handed back or released meanwhile: the Query
 * went back to Python with it). A bad row is answered as None, then raises. */
static PyObject *engine_answer(Engine *e, PyObject *args) {
    long long id;
    unsigned long long seq;
    PyObject *row;
    if (!PyArg_ParseTuple(args, "LKO", &id, &seq, &row)) return NULL;
    CHECK_STARTED(e);
    pthread_mutex_lock(&e->mu);
    conn_t *c = find(e, id);
    int live = c != NULL && !c->dead && seq != 0 && c->asking == seq;
    int bad = 0;
    if (live) {
        c->asking = 0;
        if (row != Py_None && answered_add(e, c, row) == 0) {
            c->answered = 1;
        } else {
            bad = row != Py_None;
            stop_client(c, 'Q');
        }
        settle(e, c);
        if (e->notify) {
            uint64_t one = 1;
            ssize_t w = write(e->notifyfd, &one, sizeof(one));
            (void)w;
            e->notify = 0;
        }
    }
    pthread_mutex_unlock(&e->mu);
    if (bad) return NULL; /* (answered_add set the exception) */
    return PyBool_FromLong(live);
}

/* The done read records of one connection, taken out of its ring (under the lock; Python objects are made
 * after it is released). */
typedef struct taken_reads {
    long long id;
    rec_t *v;
    long long n;
    enc_t *enc; /* the connection's encoder (a reference: the connection may go meanwhile), or NULL */
    struct taken_reads *next;
} taken_reads_t;

static taken_reads_t *take_ring(conn_t *c, double to_wall) {
    ring_t *r = &c->reads;
    long long n = 0;
    /* (Resolving: only those of ended transactions; the open one's wait for its end, or the hand-back.) */
    while (r->base + n < r->end && r->v[(r->base + n) % READ_CAP].state != 0 &&
           (c->resolve < 0 || r->v[(r->base + n) % READ_CAP].txn < c->txn))
        n++;
    if (n == 0) return NULL;
    taken_reads_t *t = malloc(sizeof(*t));
    rec_t *v = t != NULL ? malloc(sizeof(rec_t) * (size_t)n) : NULL;
    if (v == NULL) { /* left in the ring: taken the next time */
        free(t);
        return NULL;
    }
    for (long long i = 0; i < n; i++) {
        v[i] = r->v[(r->base + i) % READ_CAP];
        v[i].wall += to_wall;
    }
    r->base += n;
    r->marked = 0;
    if (r->base == r->end) r->base = r->end = 0;
    t->id = c->id;
    t->v = v;
    t->n = n;
    t->enc = enc_ref(c->enc);
    return t;
}

/* The done records of t with a head as one run (encode_records), how many, and those without one as tuples,
 * in tuples (NULL with an exception set on failure). */
static PyObject *taken_item(taken_reads_t *t) {
    PyObject *reads = PyList_New(0);
    if (reads == NULL) return NULL;
    long long count = 0;
    PyObject *rows = encode_records(t->enc, t->v, t->n, NO_TXN, reads, &count);
    if (rows == NULL) {
        Py_DECREF(reads);
        return NULL;
    }
    return Py_BuildValue("(LNNL)", t->id, reads, rows, count);
}

/* (records dropped since the last call, [(conn_id, [read record], a run, how many)]): the done reads of
 * connections on the relay, in order per connection; those C has a head for as a run, the rest (or all,
 * without an encoder) as tuples. */
static PyObject *engine_take_reads(Engine *e, PyObject *unused) {
    CHECK_STARTED(e);
    taken_reads_t *head = NULL;
    double to_wall = wall_now() - now();
    pthread_mutex_lock(&e->mu);
    for (conn_t *c = e->conns; c != NULL; c = c->next) {
        if (c->reads.v == NULL || c->reads.base == c->reads.end) continue;
        taken_reads_t *t = take_ring(c, to_wall);
        if (t != NULL) {
            t->next = head;
            head = t;
        }
    }
    unsigned long long dropped = e->reads_dropped - e->reads_dropped_told;
    e->reads_dropped_told = e->reads_dropped;
    pthread_mutex_unlock(&e->mu);
    PyObject *list = PyList_New(0);
    while (head != NULL) {
        taken_reads_t *next = head->next;
        if (list != NULL) {
            PyObject *item = taken_item(head);
            if (item == NULL || PyList_Append(list, item) < 0) Py_CLEAR(list);
            Py_XDECREF(item);
        }
        enc_unref(head->enc);
        for (long long i = 0; i < head->n; i++) rec_free(&head->v[i]);
        free(head->v);
        free(head);
        head = next;
    }
    if (list == NULL) return NULL;
    return Py_BuildValue("(KN)", dropped, list);
}

static PyObject *engine_states(Engine *e, PyObject *unused) {
    CHECK_STARTED(e);
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    pthread_mutex_lock(&e->mu);
    for (conn_t *c = e->conns; c != NULL; c = c->next) {
        char status[2] = {c->status, 0};
        PyObject *v = Py_BuildValue("(si)", status, c->qlen + (c->mid_batch || c->skip));
        PyObject *k = PyLong_FromLongLong(c->id);
        int bad = v == NULL || k == NULL || PyDict_SetItem(d, k, v) < 0;
        Py_XDECREF(v);
        Py_XDECREF(k);
        if (bad) {
            Py_CLEAR(d);
            break;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return d;
}

static PyObject *engine_stats(Engine *e, PyObject *unused) {
    CHECK_STARTED(e);
    unsigned long long statements[MAX_KINDS], latency[MAX_BUCKETS + 1], errors[MAX_ERROR_CLASSES];
    unsigned long long tagged[MAX_KINDS], writes[MAX_WRITE_SLOTS];
    char classes[MAX_ERROR_CLASSES][2];
    pthread_mutex_lock(&e->mu);
    memcpy(statements, e->statements, sizeof(statements));
    memcpy(tagged, e->statements_tagged, sizeof(tagged));
    memcpy(writes, e->writes, sizeof(writes));
    unsigned long long hits = e->decision_hits, reads_done = e->reads_done, shape_hits = e->shape_hits;
    unsigned long long rewrites = e->rewrites;
    memcpy(latency, e->latency, sizeof(latency));
    memcpy(errors, e->error_count, sizeof(errors));
    memcpy(classes, e->error_class, sizeof(classes));
    int nclasses = e->nerror_classes;
    unsigned long long up = e->bytes_up, down = e->bytes_down;
    double lsum = e->latency_sum;
    long nconns = e->nconns;
    pthread_mutex_unlock(&e->mu);
    PyObject *st = PyList_New(e->nkinds), *lat = PyList_New(e->nbounds + 1), *err = PyDict_New();
    PyObject *tg = PyList_New(e->nkinds), *wr = PyList_New(MAX_WRITE_SLOTS);
    if (st == NULL || lat == NULL || err == NULL || tg == NULL || wr == NULL) goto fail;
    for (int i = 0; i < e->nkinds; i++) PyList_SET_ITEM(st, i, PyLong_FromUnsignedLongLong(statements[i]));
    for (int i = 0; i < e->nkinds; i++) PyList_SET_ITEM(tg, i, PyLong_FromUnsignedLongLong(tagged[i]));
    for (int i = 0; i < MAX_WRITE_SLOTS; i++) PyList_SET_ITEM(wr, i, PyLong_FromUnsignedLongLong(writes[i]));
    for (int i = 0; i <= e->nbounds; i++) PyList_SET_ITEM(lat, i, PyLong_FromUnsignedLongLong(latency[i]));
    for (int i = 0; i < nclasses; i++) {
        PyObject *k = PyUnicode_DecodeLatin1(classes[i], 2, NULL);
        PyObject *v = PyLong_FromUnsignedLongLong(errors[i]);
        int bad = k == NULL || v == NULL || PyDict_SetItem(err, k, v) < 0;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (bad) goto fail;
    }
    return Py_BuildValue("(NKKNNdlNNKKKK)", st, up, down, err, lat, lsum, nconns, tg, wr, hits, reads_done,
                         shape_hits, rewrites);
fail:
    Py_XDECREF(tg);
    Py_XDECREF(wr);
    Py_XDECREF(st);
    Py_XDECREF(lat);
    Py_XDECREF(err);
    return NULL;
}

static PyObject *engine_kind(Engine *e, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    long kind = view.len >= 6 ? text_kind(e, (const unsigned char *)view.buf + 5, (size_t)view.len - 6) : -1;
    PyBuffer_Release(&view);
    return PyLong_FromLong(kind);
}

static PyObject *engine_accepts(Engine *e, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    int ok = view.len >= 5 && ((const unsigned char *)view.buf)[0] == 'Q' &&
             (uint64_t)be32((const unsigned char *)view.buf + 1) + 1 == (uint64_t)view.len &&
             query_ok(view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

static PyObject *engine_close(Engine *e, PyObject *unused) {
    engine_shutdown(e);
    Py_RETURN_NONE;
}

static PyMethodDef engine_methods[] = {
    {"fileno", (PyCFunction)engine_fileno, METH_NOARGS, "The eventfd that becomes readable when hand-backs wait."},
    {"adopt", (PyCFunction)engine_adopt, METH_VARARGS,
     "adopt(conn_id, client_fd, server_fd, max_message, statements=(), portals=(), tagged=False, decisions=(), "
     "record=False, resolve=-1, txn=0, txn_reads=0, txn_wrote=False, promotions=(), promoted=0, max_promoted=0, "
     "alias=0, alias_promotion=-1, encode=None, ask=False, status='I')"},
    {"recall", (PyCFunction)engine_recall, METH_VARARGS, "recall(conn_id) -> hand-back tuple or None"},
    {"release", (PyCFunction)engine_release, METH_VARARGS, "release(conn_id) -> bool: take it out at once"},
    {"take_handbacks", (PyCFunction)engine_take_handbacks, METH_NOARGS,
     "[(conn_id, reason, errno, status, inflight, untaken_type, unforwarded_client_bytes, owed kinds, mid_batch, "
     "skip_until_sync, statements, portals, messages taken, read records, owed reads)]"},
    {"take_requests", (PyCFunction)engine_take_requests, METH_NOARGS,
     "[(conn_id, request, Query text)]: the texts of sessions C asks Python to decide"},
    {"answer", (PyCFunction)engine_answer, METH_VARARGS,
     "answer(conn_id, request, decision or None) -> bool: a decision to take the Query by, or None: hand back"},
    {"take_reads", (PyCFunction)engine_take_reads, METH_NOARGS,
     "(read records dropped since the last call, [(conn_id, [(ref, rows, ended, duration_us, params, txn, "
     "xid, text)], a run, how many)])"},
    {"states", (PyCFunction)engine_states, METH_NOARGS, "{conn_id: (status, replies owed + open batch)}"},
    {"stats", (PyCFunction)engine_stats, METH_NOARGS,
     "(statements by kind, bytes up, bytes down, {sqlstate class: n}, latency counts, latency sum, conns, "
     "tagged statements by kind, writes by slot, decision hits, read records made, of the hits by shape, "
     "texts sent rewritten: promotions' Parses, Queries)"},
    {"kind", (PyCFunction)engine_kind, METH_O, "kind index of a Query message (as query_kind)"},
    {"accepts", (PyCFunction)engine_accepts, METH_O, "whether a whole Query message would be relayed in C"},
    {"close", (PyCFunction)engine_close, METH_NOARGS, "stop the thread (connections are dropped)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "proxy._fastrelay.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An epoll relay thread for untagged connections.",
    .tp_new = engine_new,
    .tp_init = (initproc)engine_init,
    .tp_dealloc = (destructor)engine_dealloc,
    .tp_methods = engine_methods,
};

/* shape_key(text) -> bytes | None: the key decisions of shapes are looked up by (tests compare it with
 * proxy/sql/shapes.py). */
static PyObject *module_shape_key(PyObject *unused, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    unsigned char *out = malloc(view.len > 0 ? (size_t)view.len : 1);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    long len = shape_key(view.buf, (size_t)view.len, out);
    PyBuffer_Release(&view);
    PyObject *key = len < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)out, len);
    free(out);
    return key;
}

/* encode_run(encode, records) -> bytes: the run take_reads makes of these done records (FastRead tuples), for
 * tests to compare with proxy/reads.py's encode_rows (decoded by its run_rows). */
static PyObject *module_encode_run(PyObject *unused, PyObject *args) {
    PyObject *spec, *records;
    if (!PyArg_ParseTuple(args, "OO", &spec, &records)) return NULL;
    PyObject *seq = PySequence_Fast(records, "expected a sequence of read records");
    if (seq == NULL) return NULL;
    enc_t *en = enc_load(spec);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    rec_t *v = en != NULL ? calloc((size_t)n + 1, sizeof(rec_t)) : NULL;
    PyObject *out = NULL;
    if (en != NULL && v == NULL) PyErr_NoMemory();
    taken_reads_t t = {.id = 0, .v = v, .n = 0, .enc = en, .next = NULL};
    for (Py_ssize_t i = 0; v != NULL && i < n; i++, t.n++) {
        rec_t *rec = &v[i];
        PyObject *rows, *params, *text;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "lOdLOLKO", &rec->ref, &rows, &rec->wall,
                              &rec->duration_us, &params, &rec->txn, &rec->xid, &text))
            goto done;
        rec->state = 1;
        rec->rows = rows == Py_None ? -1 : PyLong_AsLongLong(rows);
        if (rec->rows == -1 && PyErr_Occurred()) goto done;
        if (params != Py_None && (rec->params = bytes_copy(params, &rec->plen)) == NULL) goto done;
        if (text != Py_None && (rec->text = bytes_copy(text, &rec->tlen)) == NULL) goto done;
        if (rec_head(en, rec) == NULL) {
            PyErr_Format(PyExc_ValueError, "no head for ref %ld", rec->ref);
            goto done;
        }
    }
    if (v != NULL) {
        PyObject *item = taken_item(&t);
        if (item != NULL) out = Py_NewRef(PyTuple_GET_ITEM(item, 2));
        Py_XDECREF(item);
    }
done:
    for (long long i = 0; v != NULL && i < t.n + 1 && i < n; i++) rec_free(&v[i]);
    free(v);
    enc_unref(en);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef module_methods[] = {
    {"shape_key", module_shape_key, METH_O, "shape_key(text) -> the text's shape key, or None (no literal)"},
    {"encode_run", module_encode_run, METH_VARARGS, "encode_run(encode, records) -> a run, as take_reads makes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "proxy._fastrelay", "cowproxy's fast relay (an epoll thread in C).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastrelay(void) {
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "MAX_QUERY", BUF_CAP);
    PyModule_AddIntConstant(m, "API_VERSION", API_VERSION);
    return m;
}
