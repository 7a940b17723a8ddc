// The talk page: one Realtime WebSocket to this bridge, the microphone in while the talk button
// is held (or toggled on), the model's audio out through WebAudio, both transcripts live.
// Counters in the page (#sent-chunks, #recv-chunks, #played-chunks, #gaps) show what flowed.

const $ = (id) => document.getElementById(id);
const KEY_STORE = 'wave.realtime.apiKey';
const DEFAULT_RATE = 24000;          // pcm16 24 kHz both ways: what OpenAI clients expect
const LEAD_S = 0.12;                 // playback cushion against network jitter
const MAX_BUFFERED = 1 << 20;        // socket backlog past which mic chunks are dropped
const MAX_LINES = 200;               // transcript lines kept
const MAX_ERRORS = 20;
const WS_PATH = document.querySelector('meta[name="wave-realtime-path"]').content;

let ws = null;
let ready = false;                   // session.created seen on the current socket
let ctx = null;                      // the AudioContext, made on the first click (autoplay)
let mic = null;                      // promise of {stream, source, node, sink}
let talking = false;
let unsent = 0;                      // bytes appended since the last commit
let inRate = DEFAULT_RATE;
let outRate = DEFAULT_RATE;
let playHead = 0;                    // context time at which the next delta starts
let dropWarned = false;
const counts = { 'sent-chunks': 0, 'sent-bytes': 0, 'recv-chunks': 0, 'played-chunks': 0,
                 gaps: 0 };
const lines = new Map();             // "who:id" -> the transcript line's text element

function bump(name, by = 1) {
  counts[name] += by;
  $(name).textContent = String(counts[name]);
}

function setState(state, detail = '') {
  const out = $('state');
  out.dataset.state = state;
  out.textContent = detail ? `${state}: ${detail}` : state;
}

function showError(text) {
  const list = $('errors');
  const li = document.createElement('li');
  li.textContent = text;
  list.append(li);
  while (list.children.length > MAX_ERRORS) list.firstElementChild.remove();
}

function transcript(who, id, text, replace = false) {
  const key = `${who}:${id}`;
  let el = lines.get(key);
  if (!el) {
    const li = document.createElement('li');
    li.className = who;
    const name = document.createElement('span');
    name.className = 'who';
    name.textContent = who === 'user' ? 'You:' : 'Agent:';
    el = document.createElement('span');
    el.className = 'text';
    li.append(name, el);
    const log = $('transcript');
    log.append(li);
    lines.set(key, el);
    while (log.children.length > MAX_LINES) {
      const old = log.firstElementChild;
      for (const [k, v] of lines) if (v.parentElement === old) lines.delete(k);
      old.remove();
    }
  }
  el.textContent = replace ? text : el.textContent + text;
  const log = $('transcript');
  log.scrollTop = log.scrollHeight;
}

// ---- base64 <-> bytes ------------------------------------------------------------------------

function toBase64(bytes) {
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

function fromBase64(b64) {
  const s = atob(b64);
  const bytes = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  return bytes;
}

// ---- audio out -------------------------------------------------------------------------------

function audioContext() {
  if (!ctx) ctx = new AudioContext();
  if (ctx.state === 'suspended') ctx.resume();
  return ctx;
}

// Each delta is scheduled right after the previous one on the audio clock, so consecutive
// deltas play without a seam; one that arrives after its predecessor ended restarts the
// cushion and counts as a gap.
function play(b64) {
  bump('recv-chunks');
  if (!ctx || ctx.state !== 'running') return;     // no gesture yet: nothing may play
  const bytes = fromBase64(b64);
  const n = bytes.length >> 1;
  if (n === 0) return;
  const view = new DataView(bytes.buffer, bytes.byteOffset, n * 2);
  const buf = ctx.createBuffer(1, n, outRate);
  const ch = buf.getChannelData(0);
  for (let i = 0; i < n; i++) ch[i] = view.getInt16(2 * i, true) / 32768;
  const src = ctx.createBufferSource();
  src.buffer = buf;
  src.connect(ctx.destination);
  src.onended = () => bump('played-chunks');
  const now = ctx.currentTime;
  if (playHead < now) {
    if (playHead > 0) bump('gaps');
    playHead = now + LEAD_S;
  }
  src.start(playHead);
  playHead += buf.duration;
}

// ---- microphone in ---------------------------------------------------------------------------

async function openMic() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new Error(window.isSecureContext ? 'this browser has no microphone API'
      : 'the microphone needs https (or localhost)');
  }
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true,
             autoGainControl: true },
  });
  const c = audioContext();
  await c.audioWorklet.addModule('/web/mic-worklet.js');
  const source = c.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(c, 'mic-pcm16', {
    numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1],
    processorOptions: { targetRate: inRate, chunkMs: 40 },
  });
  // A muted path to the destination keeps the worklet pulled by the render graph.
  const sink = c.createGain();
  sink.gain.value = 0;
  source.connect(node).connect(sink).connect(c.destination);
  node.port.onmessage = (e) => onMic(e.data);
  return { stream, source, node, sink };
}

function closeMic() {
  const m = mic;
  mic = null;
  if (!m) return;
  m.then((x) => {
    x.stream.getTracks().forEach((t) => t.stop());
    x.source.disconnect();
    x.node.disconnect();
    x.sink.disconnect();
  }, () => {});
}

function send(event) {
  if (!ws || ws.readyState !== WebSocket.OPEN) return false;
  ws.send(JSON.stringify(event));
  return true;
}

function onMic(msg) {
  if (msg.type === 'chunk') {
    if (!ws || ws.readyState !== WebSocket.OPEN) return;
    if (ws.bufferedAmount > MAX_BUFFERED) {
      if (!dropWarned) showError('the network is too slow: microphone audio is being dropped');
      dropWarned = true;
      return;
    }
    const bytes = new Uint8Array(msg.pcm);
    send({ type: 'input_audio_buffer.append', audio: toBase64(bytes) });
    unsent += bytes.length;
    bump('sent-chunks');
    bump('sent-bytes', bytes.length);
  } else if (msg.type === 'flushed' && unsent > 0) {
    // The end of the user's turn: commit closes the user item (and its transcript).
    if (send({ type: 'input_audio_buffer.commit' })) unsent = 0;
  }
}

async function startTalking() {
  if (talking || !ready) return;
  talking = true;
  renderTalk();
  try {
    if (!mic) mic = openMic();
    const m = await mic;
    if (talking) m.node.port.postMessage({ active: true });
  } catch (e) {
    mic = null;
    talking = false;
    renderTalk();
    showError(`microphone: ${e.message || e}`);
  }
}

function stopTalking() {
  if (!talking) return;
  talking = false;
  renderTalk();
  if (mic) mic.then((m) => m.node.port.postMessage({ active: false }), () => {});
}

function renderTalk() {
  const b = $('talk');
  b.disabled = !ready;
  b.setAttribute('aria-pressed', String(talking));
  const toggle = $('toggle').checked;
  b.textContent = talking ? (toggle ? 'Talking: click to stop' : 'Talking…')
    : (toggle ? 'Click to talk' : 'Hold to talk');
}

// ---- the Realtime socket ---------------------------------------------------------------------

function onSession(session) {
  const input = session && session.audio && session.audio.input && session.audio.input.format;
  const output = session && session.audio && session.audio.output && session.audio.output.format;
  if (output && output.type === 'audio/pcm') outRate = output.rate || DEFAULT_RATE;
  else if (output) showError(`this page plays only audio/pcm, not ${output.type}`);
  if (input && input.type === 'audio/pcm') {
    inRate = input.rate || DEFAULT_RATE;
    if (mic) mic.then((m) => m.node.port.postMessage({ rate: inRate }), () => {});
  } else if (input) {
    showError(`this page sends only audio/pcm, not ${input.type}`);
  }
}

function onEvent(ev) {
  switch (ev.type) {
    case 'session.created':
      ready = true;
      setState('connected', ev.session && ev.session.id ? `session ${ev.session.id}` : '');
      renderTalk();
      onSession(ev.session);
      send({ type: 'session.update', session: { type: 'realtime', audio: {
        input: { format: { type: 'audio/pcm', rate: DEFAULT_RATE } },
        output: { format: { type: 'audio/pcm', rate: DEFAULT_RATE } } } } });
      break;
    case 'session.updated':
      onSession(ev.session);
      break;
    case 'response.output_audio.delta':
    case 'response.audio.delta':
      play(ev.delta);
      break;
    case 'response.output_audio_transcript.delta':
    case 'response.audio_transcript.delta':
      transcript('agent', ev.item_id || ev.response_id, ev.delta || '');
      break;
    case 'conversation.item.input_audio_transcription.delta':
      transcript('user', ev.item_id, ev.delta || '');
      break;
    case 'conversation.item.input_audio_transcription.completed':
      if (ev.transcript) transcript('user', ev.item_id, ev.transcript, true);
      break;
    case 'error': {
      const e = ev.error || {};
      showError(`${e.code || e.type || 'error'}: ${e.message || ''}`);
      break;
    }
    case 'session.closed':
      setState('closed', 'the model ended the session');
      break;
    default:
      break;
  }
}

// A browser is not told why a WebSocket handshake failed; asking the endpoint over plain HTTP
// (same key, as a header) gets the bridge's status: 401 for a key it refuses.
async function explainRefusal(key) {
  try {
    const r = await fetch(WS_PATH, { cache: 'no-store',
      headers: key ? { Authorization: `Bearer ${key}` } : {} });
    if (r.status === 401) showError('the bridge refused the API key (HTTP 401)');
    else if (r.status === 404) showError(`the bridge has no Realtime endpoint at ${WS_PATH}`);
    else showError(`the WebSocket did not open (the endpoint answers HTTP ${r.status})`);
  } catch (e) {
    showError(`the bridge is unreachable: ${e.message || e}`);
  }
}

function connect() {
  const key = $('key').value.trim();
  if (key) localStorage.setItem(KEY_STORE, key);
  $('errors').replaceChildren();       // the errors shown are the current connection's
  audioContext();                      // inside the click: the browser lets it play
  const protocols = ['realtime'];
  if (key) protocols.push(`openai-insecure-api-key.${key}`);
  const url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}${WS_PATH}`;
  let sock;
  try {
    sock = new WebSocket(url, protocols);
  } catch (e) {
    setState('error', 'could not connect');
    showError(`the key cannot be sent as a WebSocket subprotocol: ${e.message || e}`);
    return;
  }
  ws = sock;
  let opened = false;
  setState('connecting');
  $('connect').textContent = 'Disconnect';
  sock.onopen = () => {
    opened = true;
    setState('connecting', 'waiting for the session');
  };
  sock.onmessage = (m) => {
    if (ws !== sock) return;
    let ev;
    try {
      ev = JSON.parse(m.data);
    } catch (e) {
      showError('the bridge sent an event that is not JSON');
      return;
    }
    onEvent(ev);
  };
  sock.onclose = (e) => {
    if (ws !== sock) return;
    ws = null;
    ready = false;
    stopTalking();
    closeMic();                        // the browser's microphone indicator goes off with it
    renderTalk();
    $('connect').textContent = 'Connect';
    playHead = 0;
    if (!opened) {
      setState('error', 'the WebSocket did not open');
      explainRefusal(key);
    } else if ($('state').dataset.state !== 'closed') {
      setState('closed', `code ${e.code}${e.reason ? ` (${e.reason})` : ''}`);
    }
  };
}

function disconnect() {
  const sock = ws;
  ws = null;
  ready = false;
  stopTalking();
  closeMic();
  renderTalk();
  $('connect').textContent = 'Connect';
  playHead = 0;
  if (sock) sock.close(1000, 'bye');
  setState('disconnected');
}

// ---- wiring ----------------------------------------------------------------------------------

function init() {
  $('key').value = localStorage.getItem(KEY_STORE) || '';
  $('connect-form').addEventListener('submit', (e) => {
    e.preventDefault();
    if (ws) disconnect();
    else connect();
  });
  $('forget').addEventListener('click', () => {
    localStorage.removeItem(KEY_STORE);
    $('key').value = '';
    $('key').focus();
  });

  const talk = $('talk');
  const hold = () => !$('toggle').checked;
  // Hold mode: pointer and Space/Enter down/up; toggle mode: a click (mouse or key).
  talk.addEventListener('pointerdown', (e) => {
    if (!hold() || e.button !== 0) return;
    e.preventDefault();
    talk.setPointerCapture(e.pointerId);
    startTalking();
  });
  for (const type of ['pointerup', 'pointercancel', 'lostpointercapture']) {
    talk.addEventListener(type, () => { if (hold()) stopTalking(); });
  }
  talk.addEventListener('keydown', (e) => {
    if (!hold() || (e.key !== ' ' && e.key !== 'Enter')) return;
    e.preventDefault();
    if (!e.repeat) startTalking();
  });
  talk.addEventListener('keyup', (e) => {
    if (!hold() || (e.key !== ' ' && e.key !== 'Enter')) return;
    e.preventDefault();
    stopTalking();
  });
  talk.addEventListener('blur', () => { if (hold()) stopTalking(); });
  talk.addEventListener('click', () => {
    if (hold()) return;
    if (talking) stopTalking();
    else startTalking();
  });
  $('toggle').addEventListener('change', () => {
    stopTalking();
    renderTalk();
  });

  document.addEventListener('securitypolicyviolation', (e) => {
    showError(`blocked by the page's security policy: ${e.violatedDirective} ${e.blockedURI}`);
  });
  window.addEventListener('error', (e) => showError(`page error: ${e.message}`));
  window.addEventListener('unhandledrejection', (e) => {
    showError(`page error: ${(e.reason && e.reason.message) || e.reason}`);
  });
  renderTalk();
}

init();
