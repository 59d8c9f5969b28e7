#!/usr/bin/env python3
"""Writes the committed seed corpora under fuzz/corpus/<target>/ from real
inputs: the sphn-written Ogg Opus fixtures of daemon/tests/data, the example
configs, typical HTTP requests and query strings, SIP and SDP as sipp and
baresip write them. Run again after changing an input format; the files are
small and deterministic.

    fuzz/make_seeds.py                 every target's seeds
    fuzz/make_seeds.py sip_message ... those targets' seeds only
    fuzz/make_seeds.py --list          the targets with a generator

One generator per target: a function decorated with @seeds("TARGET") that
yields (file name, bytes) pairs; a new fuzz target adds one such function
(several may serve one target). Files this script does not name are left
alone: the minimised corpus (SHA-1 names, from `scripts/fuzz cmin`) and
regression inputs (`regress-*`, committed by hand with their fix)."""

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OGGS = [os.path.join(ROOT, "daemon/tests/data", f) for f in ("sphn_sine440_1s.ogg", "sphn_chirp_2s.ogg")]

# target -> generators, each yielding (file name, bytes).
GENERATORS = {}


def seeds(target):
    """Registers the decorated generator as a source of `target`'s seeds."""
    def register(fn):
        GENERATORS.setdefault(target, []).append(fn)
        return fn
    return register


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def pages(ogg):
    out, i = [], 0
    while i + 27 <= len(ogg):
        assert ogg[i:i + 4] == b"OggS"
        n = ogg[i + 26]
        end = i + 27 + n + sum(ogg[i + 27:i + 27 + n])
        out.append(ogg[i:end])
        i = end
    return out


def msg(kind, payload=b""):
    body = bytes([kind]) + payload
    return struct.pack(">H", len(body)) + body


@seeds("ogg_opus_decoder")
def ogg_opus_decoder():
    # [flags, split seed, stream]
    for path in OGGS:
        name = os.path.basename(path)[:-4]
        ogg = open(path, "rb").read()
        yield name, bytes([0, 0]) + ogg
        yield name + "-split7-trim", bytes([2, 7]) + ogg
        yield name + "-head-only", bytes([0, 3]) + b"".join(pages(ogg)[:2])


@seeds("ws_client_message")
def ws_client_message():
    # [flags, (u16 len, message)...], one page per message as sphn's writer
    # hands them out, plus kinds the server ignores.
    for path in OGGS:
        name = os.path.basename(path)[:-4]
        ps = pages(open(path, "rb").read())
        yield name, bytes([0]) + msg(0x00) + b"".join(msg(0x01, p) for p in ps[:12])
        yield name + "-mixed", (bytes([1]) + msg(0x01, b"".join(ps[:3])) + msg(0x02, b"hello")
                                + msg(0x06) + msg(0x01, b"".join(ps[3:8])) + msg(0x03, b"\x00") + msg(0x07, b"?"))


@seeds("http_head")
def http_head():
    # [split seed, request bytes]
    requests = {
        "ws-upgrade": b"GET /api/chat?text_temperature=0.7&seed=42&condition.description=very_good HTTP/1.1\r\n"
        b"Host: 127.0.0.1:8998\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"Authorization: Bearer s3cret\r\n\r\n\x82\x81abcd\x01",
        "health": b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
        "capacity-api-key": b"GET /capacity HTTP/1.0\r\nkyutai-api-key: s3cret\r\n\r\n",
        "post-body": b"POST /admin/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 17\r\nExpect: 100-continue\r\n\r\n{\"enabled\": true}",
        "absolute-form": b"GET http://example.com/ready?x=%20y HTTP/1.1\r\nHost: example.com\r\n\r\n",
        "chunked": b"POST /v1/rtp/sessions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    }
    for name, req in requests.items():
        yield name, bytes([0]) + req
        yield name + "-split", bytes([5]) + req


@seeds("config_json")
def config_json():
    # The shipped examples and the defaults of docs/configuration.md.
    yield "empty", b"{}"
    yield "example", open(os.path.join(ROOT, "systemd/moshid.example.json"), "rb").read()
    defaults = {
        "model": {"dir": None, "backend": "auto", "max_slots": 8, "cache_dir": None},
        "runtime": {"io_cores": 1, "io_cpus": None, "engine_cpu": None},
        "engine": {"phase_groups": 1, "budget_margin_ms": 10.0, "queued_frames_per_slot": 4, "warmup_steps": 3},
        "listen": {"address": "127.0.0.1:8998", "max_connections_per_core": 1024, "max_connections_per_ip": 0,
                   "agent_address": None, "token": None, "max_head_bytes": 16384, "max_body_bytes": 65536,
                   "head_timeout_ms": 5000},
        "session": {"max_message_bytes": 65536, "max_frames_in_flight": 8, "idle_timeout_ms": 30000,
                    "max_session_seconds": 3600, "max_queued_messages": 256, "drain_grace_ms": 30000},
        "defaults": {"text_temperature": 0.7, "text_topk": 25, "audio_temperature": 0.8, "audio_topk": 250,
                     "cfg_coef": 1.0},
    }
    yield "defaults", json.dumps(defaults, indent=1).encode()
    yield "public", (b'{"listen": {"address": "[::]:8998", "token": "t", "agent_address": "0.0.0.0:9998"},'
                     b' "runtime": {"io_cores": 2, "io_cpus": [0, 1]}, "engine": {"phase_groups": 4, "budget_margin_ms": 2.5}}')


@seeds("session_query")
def session_query():
    # Raw query strings as clients send them.
    for i, q in enumerate([
        "text_temperature=0.7&text_topk=25&audio_temperature=0.8&audio_topk=250&seed=42",
        "greedy=true&seed=-1&worker_auth_id=abc&pad_mult=0",
        "condition.description=very_good&null_condition.description=very_bad&cfg_coef=3.0",
        "?text_temperature=1e1&audio_topk=1000000&greedy=0&x=%C3%A9+y",
        "pad_mult=-1.5&repetition_penalty=1.2&repetition_penalty_context=64",
        "voice_prompt=NATF0.pt&text_prompt=You%20enjoy%20having%20a%20good%20conversation.",
        "voice_prompt=..%2Fx.pt&text_prompt=&repetition_penalty=1",
    ]):
        yield "q%d" % i, q.encode()


PERSONA = os.path.join(ROOT, "..", "shared", "golden-next", "personaplex-tiny")


@seeds("voice_pt")
def voice_pt():
    # NVIDIA's .pt as torch.save writes it (the fixture's), and cuts of it.
    pt = os.path.join(PERSONA, "voice_b.pt")
    if os.path.exists(pt):
        data = open(pt, "rb").read()
        yield "voice_b", data
        yield "voice_b-half", data[: len(data) // 2]
        yield "voice_b-tail", data[-600:]


def wav(rate, bits, fmt, samples, channels=1, extensible=False):
    width = bits // 8
    if fmt == 3:
        body = b"".join(struct.pack("<f" if bits == 32 else "<d", s) for s in samples)
    elif bits == 8:
        body = bytes(int(128 + 127 * s) for s in samples)
    else:
        body = b"".join(int(s * (2 ** (bits - 1) - 1)).to_bytes(width, "little", signed=True) for s in samples)
    tag = 0xFFFE if extensible else fmt
    fmt_body = struct.pack("<HHIIHH", tag, channels, rate, rate * width * channels, width * channels, bits)
    if extensible:
        fmt_body += struct.pack("<HHI", 22, bits, 4) + struct.pack("<H", fmt) + bytes(14)
    chunks = b"fmt " + struct.pack("<I", len(fmt_body)) + fmt_body + b"data" + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


@seeds("voice_wav")
def voice_wav():
    import math
    sine = [0.3 * math.sin(2 * math.pi * 220 * i / 24000) for i in range(12000)]
    yield "pcm16-24k", wav(24000, 16, 1, sine)
    yield "float32-24k", wav(24000, 32, 3, sine[:4000])
    yield "pcm24-24k-ext", wav(24000, 24, 1, sine[:3000], extensible=True)
    yield "pcm8-16k", wav(16000, 8, 1, sine[:2000])
    yield "stereo16-48k", wav(48000, 16, 1, sine[:2000], channels=2)
    a = os.path.join(PERSONA, "voice_a.wav")
    if os.path.exists(a):
        yield "voice_a", open(a, "rb").read()


def safetensors(tensors):
    header, offset, data = {}, 0, b""
    for name, shape in tensors:
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]}
        data += bytes(n)
        offset += n
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


@seeds("lora_adapter")
def lora_adapter():
    # Small shapes: the header is what is parsed (data is never read).
    yield "one-pair", safetensors([("text_linear.lora_A.weight", [8, 16]), ("text_linear.lora_B.weight", [16, 8])])
    yield "stacked-layout", safetensors([("transformer.layers.0.self_attn.in_proj.lora_A.weight", [8, 16])])
    yield "half-pair", safetensors([("linears.0.lora_B.weight", [16, 8])])
    yield "ft-embed", safetensors([("text_emb.weight", [4, 4])])
    f = os.path.join(ROOT, "..", "shared", "golden-next", "moshi-lora-tiny", "lora.safetensors")
    if os.path.exists(f):
        data = open(f, "rb").read()
        n = struct.unpack("<Q", data[:8])[0]
        yield "moshi-lora-tiny-header", data[: 8 + n]


def rtp(pt, seq, ts, payload, marker=False, csrc=0, ext=None, pad=0):
    b0 = 0x80 | (0x20 if pad else 0) | (0x10 if ext is not None else 0) | csrc
    out = struct.pack(">BBHII", b0, (0x80 if marker else 0) | pt, seq, ts, 0x1234ABCD)
    out += b"\x00\x00\x00\x01" * csrc
    if ext is not None:
        out += struct.pack(">HH", 0xBEDE, len(ext) // 4) + ext
    out += payload
    if pad:
        out += b"\x00" * (pad - 1) + bytes([pad])
    return out


def dg(b):
    return struct.pack(">H", len(b)) + b


@seeds("rtp_packet")
def rtp_packet():
    # [dtmf payload type, (u16 len, datagram)...]: PCMU audio, a padded
    # packet with a CSRC and an extension, RTCP, and one RFC 4733 digit
    # (start, continuation, three end packets).
    stream = [rtp(0, 1, 160, b"\xff" * 160), rtp(0, 2, 320, b"\x7f" * 160, csrc=1, ext=b"\x10\x01\x02\x03", pad=4)]
    stream.append(struct.pack(">BBHI", 0x81, 201, 7, 0x1234ABCD) + b"\x00" * 24)  # RTCP RR
    for i, (e_bit, dur) in enumerate([(0, 160), (0, 320), (1, 480), (1, 480), (1, 480)]):
        stream.append(rtp(101, 3 + i, 480, struct.pack(">BBH", 5, (0x80 if e_bit else 0) | 10, dur), marker=(i == 0)))
    yield "pcmu-dtmf5", bytes([101]) + b"".join(dg(x) for x in stream)
    yield "dtmf-hash-star", bytes([96]) + b"".join(dg(rtp(96, s, ts, struct.pack(">BBH", ev, 0x8A, 800)))
                                                   for s, ts, ev in [(1, 0, 11), (2, 0, 11), (3, 1600, 10)])


@seeds("rtp_control_json")
def rtp_control_json():
    # Bodies of POST /v1/rtp/sessions.
    for name, body in {
        "pcmu": {"codec": "PCMU", "remote": "127.0.0.1:40000", "dtmf_payload_type": 101},
        "l16": {"codec": "L16", "payload_type": 96, "sample_rate": 16000, "ptime_ms": 20,
                "params": {"seed": 42, "greedy": True, "text_temperature": "0.5"}},
        "opus": {"codec": "opus", "payload_type": 111, "ptime_ms": 40},
    }.items():
        yield name, json.dumps(body).encode()


# Offers as sipp and baresip send them.
SDP = {
    "pcmu": "v=0\r\no=user1 53655765 2353687637 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            "m=audio 6000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
            "a=fmtp:101 0-16\r\na=ptime:20\r\n",
    "opus-baresip": "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            "m=audio 10000 RTP/AVP 96 0 8 101\r\na=rtpmap:96 opus/48000/2\r\na=fmtp:96 stereo=1;sprop-stereo=1\r\n"
            "a=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\na=label:1\r\na=ssrc:1 cname:x\r\n"
            "m=video 0 RTP/AVP 97\r\n",
    "l16-hold": "v=0\r\no=- 1 3 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 0.0.0.0\r\nt=0 0\r\n"
            "m=audio 4000 RTP/AVP 97\r\na=rtpmap:97 L16/16000\r\na=sendonly\r\n",
}


@seeds("sdp_offer")
def sdp_offer():
    for name, sdp in SDP.items():
        yield name, sdp.encode()


def sip(method, extra="", body="", uri="sip:moshi@127.0.0.1:5060;seed=7", tag=""):
    to_tag = f";tag={tag}" if tag else ""
    head = (f"{method} {uri} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-1-0;rport\r\n"
            f"From: sipp <sip:sipp@127.0.0.1:5061>;tag=1\r\nTo: <sip:moshi@127.0.0.1>{to_tag}\r\n"
            f"Call-ID: 1-1@127.0.0.1\r\nCSeq: 1 {method}\r\nContact: <sip:sipp@127.0.0.1:5061>\r\n"
            f"Max-Forwards: 70\r\n{extra}")
    if body:
        head += f"Content-Type: application/sdp\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    else:
        head += "Content-Length: 0\r\n\r\n"
    return head.encode()


@seeds("sip_message")
def sip_message():
    # The requests of a call, a response, compact header forms.
    yield "invite", sip("INVITE", body=SDP["pcmu"])
    yield "options", sip("OPTIONS")
    yield "bye", sip("BYE", tag="abc")
    yield "response", (b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKx\r\n"
                       b"From: <sip:a@h>;tag=1\r\nTo: <sip:b@h>;tag=2\r\nCall-ID: c\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n")
    yield "compact", (b"OPTIONS sip:h SIP/2.0\r\nv: SIP/2.0/TCP h, SIP/2.0/UDP g\r\nf: <sip:a@h>;tag=1\r\n"
                      b"t: sip:b@h\r\ni: x\r\nCSeq: 1 OPTIONS\r\nl: 0\r\n\r\n")


@seeds("sip_tcp_framing")
def sip_tcp_framing():
    # The first byte is the read size (% 64 + 1), then a stream: pipelined
    # messages, keep-alives, a missing Content-Length.
    opts = sip("OPTIONS")
    yield "pipelined", b"\x07" + b"\r\n\r\n" + opts + b"\r\n" + opts + sip("BYE", tag="abc")
    yield "bytewise", b"\x00" + sip("INVITE", body=SDP["pcmu"])
    yield "no_length", b"\x3f" + b"OPTIONS sip:h SIP/2.0\r\nVia: SIP/2.0/TCP h\r\n\r\n"


@seeds("sip_auth_header")
def sip_auth_header():
    # Authorization values as sipp, baresip and RFC 7616 write them, and a
    # few broken ones.
    auth = {
        "sipp-md5": 'Digest username="alice",realm="moshid",cnonce="6b8b4567",nc=00000001,qop=auth,'
                    'uri="sip:moshi@127.0.0.1:5060",nonce="0000000000005e100000000000000002490bc1f7a8e55ea6cda5f574bf7b686a",'
                    'response="22012bac19c36180103e8bcf90db7e9f",algorithm=MD5,opaque="7c6ab9dd8da35bb3b16a85b8"',
        "rfc7616-sha256": 'Digest username="Mufasa", realm="http-auth@example.org", uri="/dir/index.html", '
                          'algorithm=SHA-256, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", nc=00000001, '
                          'cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", qop=auth, '
                          'response="753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1", '
                          'opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"',
        "escapes": 'digest USERNAME="a\\"b, c",Realm="r\\\\x" , nonce = n1,uri="sip:m@h;x=\\"y\\""',
        "broken": 'Digest username="alice, realm=moshid,,nc=1',
    }
    for name, value in auth.items():
        yield name, value.encode()


def response(code, reason, headers="", body=b""):
    head = (f"SIP/2.0 {code} {reason}\r\nVia: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK1\r\n"
            f"From: <sip:moshid@127.0.0.1>;tag=a\r\nTo: <sip:b@127.0.0.1>;tag=b\r\nCall-ID: c@moshid\r\n"
            f"CSeq: 1 INVITE\r\n{headers}Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


@seeds("sip_client_response")
def sip_client_response():
    # Answers to moshid's INVITE and REGISTER: challenges as sipp and RFC
    # 2617 write them, an SDP answer, a REGISTER's 200.
    yield "401-md5", response(401, "Unauthorized", 'WWW-Authenticate: Digest realm="pbx.test", nonce="47a1d9c31", '
                                                   'qop="auth", algorithm=MD5, opaque="op1"\r\n')
    yield "407-two", response(407, "Proxy Authentication Required",
                              'Proxy-Authenticate: Digest realm="r", nonce="n", algorithm=MD5\r\n'
                              'Proxy-Authenticate: Digest realm="r", nonce="n", qop="auth,auth-int", algorithm=SHA-256\r\n')
    yield "200-sdp", response(200, "OK", "Content-Type: application/sdp\r\n",
                              b"v=0\r\no=- 1 1 IN IP4 127.0.0.2\r\ns=-\r\nc=IN IP4 127.0.0.2\r\nt=0 0\r\n"
                              b"m=audio 30000 RTP/AVP 0 102\r\na=rtpmap:102 telephone-event/8000\r\na=ptime:30\r\n")
    yield "200-register", response(200, "OK", "Contact: <sip:600@127.0.0.1:5060>;expires=120\r\nExpires: 300\r\n")


def text_msgs(events):
    """`(u16 length, message)` of each event, JSON unless already bytes."""
    out = b""
    for e in events:
        body = e if isinstance(e, bytes) else json.dumps(e).encode()
        out += struct.pack(">H", len(body)) + body
    return out


@seeds("realtime_client_event")
def realtime_client_event():
    # [flags, (u16 len, message)...]: events as the openai SDK and Pipecat
    # send them; flags bit 0 picks the translation endpoint, bits 1-3 the
    # frame budget.
    import base64
    import math
    pcm = b"".join(struct.pack("<h", int(9000 * math.sin(i / 10))) for i in range(2400))
    b64 = base64.b64encode(pcm).decode()
    update = {"type": "session.update", "session": {"type": "realtime", "model": "m", "tools": [],
              "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                  "turn_detection": {"type": "server_vad", "threshold": 0.5,
                                                     "prefix_padding_ms": 300, "silence_duration_ms": 500}},
                        "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": None}}}}
    g711 = {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}},
                                                            "output": {"format": {"type": "audio/pcma"}}}}}
    append = {"type": "input_audio_buffer.append", "event_id": "e1", "audio": b64}
    yield "sdk-conversation", bytes([6]) + text_msgs([
        update, append, append, {"type": "input_audio_buffer.commit"},
        {"type": "response.create", "response": {"output_modalities": ["audio"]}},
        {"type": "response.cancel"}, {"type": "input_audio_buffer.clear"},
        {"type": "conversation.item.truncate", "item_id": "item_1_a1", "content_index": 0, "audio_end_ms": 500},
        {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "hi"}]}},
        {"type": "session.update", "session": {"instructions": "be brief", "audio": {"output": {"voice": "alloy"}}}},
    ])
    yield "g711", bytes([0]) + text_msgs([g711, {"type": "input_audio_buffer.append",
                                                 "audio": base64.b64encode(bytes(range(256)) * 3).decode()}])
    yield "translation", bytes([3]) + text_msgs([
        {"type": "session.update", "session": {"audio": {"output": {"language": "en"},
                                                         "input": {"transcription": None}}}},
        {"type": "session.input_audio_buffer.append", "audio": b64},
        {"type": "session.close"},
    ])
    yield "malformed", bytes([0]) + text_msgs([append, b'{"type": "input_audio_buffer.append", "audio": "AA=="}'])
    yield "not-json", bytes([0]) + text_msgs([b"{not json"])


def main(argv):
    if argv == ["--list"]:
        print("\n".join(sorted(GENERATORS)))
        return 0
    unknown = [t for t in argv if t not in GENERATORS]
    if unknown:
        print("make_seeds: no generator for " + ", ".join(unknown), file=sys.stderr)
        return 2
    for target in argv or sorted(GENERATORS):
        for generate in GENERATORS[target]:
            for name, data in generate():
                write(target, name, data)
    targets = {f[:-3] for f in os.listdir(os.path.join(HERE, "fuzz_targets")) if f.endswith(".rs")}
    for t in sorted(targets - set(GENERATORS)):
        print(f"make_seeds: fuzz_targets/{t}.rs has no generator here (add one with @seeds({t!r}))", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
