/**
 * The status-bar item ("46.0 tokens −2.0/h ~28 h") and the panel it opens.
 * Plain DOM widgets: re-rendered from the model on every poll, and once a
 * second while a cull countdown runs.
 */
import { Popup, showPopup } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import {
  formatAmount,
  formatCullWarning,
  floorStopAt,
  type ISummary,
  formatGpu,
  formatPrice,
  formatRelative,
  roundDecimal,
  stateLabel,
  summarize
} from './format';
import { hasCountdown, renderActivity, statusNote } from './gpus';
import { appendMemoryWarnings, memoryFlag } from './memory';
import { BalanceModel } from './model';
import { cullDone, floorStopDetail, KERNELS_STOPPED_DETAIL, noticeFlag, noticesBox } from './notices';
import { saveFlag, saveNote, SaveBeforeStop } from './save';
import type { IAllocation, IMe } from './types';

const UNAVAILABLE = 'balance unavailable';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** Runs `fn` every second while `active()`; used for cull countdowns. */
class Ticker {
  constructor(private fn: () => void) {}

  update(active: boolean): void {
    if (active && this._timer === null) {
      this._timer = window.setInterval(this.fn, 1000);
    } else if (!active && this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
  }

  private _timer: number | null = null;
}

/** The status-bar item. */
export class BalanceStatusItem extends Widget {
  constructor(model: BalanceModel, saver: SaveBeforeStop | null = null) {
    super();
    this._model = model;
    this._saver = saver;
    this.addClass('gp-Balance');
    this.addClass('jp-mod-highlighted');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.dataset.gpupool = 'status';
    this._balance = el('span', 'gp-Balance-amount');
    this._burn = el('span', 'gp-Balance-burn');
    this._left = el('span', 'gp-Balance-left');
    this._flagsNode = el('span', 'gp-Balance-flags');
    this._cull = el('span', 'gp-Balance-cull');
    this._gpus = el('span', 'gp-Balance-gpus');
    this.node.append(this._balance, this._burn, this._left, this._flagsNode, this._cull, this._gpus);
    this.node.addEventListener('click', this);
    this.node.addEventListener('keydown', this);
    model.changed.connect(this._render, this);
    saver?.changed.connect(this._render, this);
    this._render();
  }

  handleEvent(event: Event): void {
    if (event.type === 'click') {
      this.togglePanel();
    } else if (event.type === 'keydown') {
      const key = (event as KeyboardEvent).key;
      if (key === 'Enter' || key === ' ') {
        event.preventDefault();
        this.togglePanel();
      }
    }
  }

  togglePanel(): void {
    if (this._popup && !this._popup.isDisposed) {
      this._popup.dispose();
      this._popup = null;
      return;
    }
    const body = new BalancePanel(this._model, this._saver);
    this._popup = showPopup({ body, anchor: this, align: 'left', hasDynamicSize: true });
    this._popup.disposed.connect(() => {
      body.dispose();
      this._popup = null;
    });
    void this._model.refresh();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._ticker.update(false);
    this._popup?.dispose();
    this._model.changed.disconnect(this._render, this);
    this._saver?.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const me = this._model.data;
    const node = this.node;
    if (!me) {
      node.dataset.state = 'unavailable';
      this._balance.textContent = this._model.updatedAt ? UNAVAILABLE : 'GPU pool …';
      this._burn.textContent = '';
      this._left.textContent = '';
      this._flagsNode.textContent = '';
      this._cull.textContent = '';
      this._gpus.textContent = '';
      node.title = this._model.error ? `${UNAVAILABLE}: ${this._model.error}` : 'GPU pool balance';
      this._ticker.update(false);
      return;
    }
    const s = summarize(me, Date.now());
    node.dataset.state = s.state;
    node.dataset.cull = s.cull ? 'yes' : 'no';
    this._balance.textContent = s.balance;
    this._burn.textContent = s.burn;
    this._left.textContent = s.left; // "~28 h left", or near the floor: "GPU servers stop at the floor (−10) in ~10 min"
    node.dataset.floor = s.floorFirst ? 'first' : s.floorNear ? 'near' : 'far';
    const saving = this._saver?.status;
    node.dataset.saved = saving?.state ?? 'none';
    const flags = [s.borrowed ? 'borrowed' : '', s.delayed ? 'delayed' : '', memoryFlag(me.memory_warnings), noticeFlag(me),
      saving ? saveFlag(saving) : ''].filter(Boolean);
    this._flagsNode.textContent = flags.join(' · ');
    this._cull.textContent = s.cull ? `\u26a0 ${s.cull}` : '';
    this._gpus.textContent = s.cull ? '' : statusNote(me, Date.now()); // a cull warning says it already
    const note = saving ? saveNote(saving) : '';
    node.title = note ? `${s.title}\n${note}` : s.title;
    this._ticker.update((!!me.cull_warning && !cullDone(me.cull_warning)) || hasCountdown(me) || s.floorNear);
  }

  private _model: BalanceModel;
  private _saver: SaveBeforeStop | null;
  private _balance: HTMLSpanElement;
  private _burn: HTMLSpanElement;
  private _left: HTMLSpanElement;
  private _flagsNode: HTMLSpanElement;
  private _cull: HTMLSpanElement;
  private _gpus: HTMLSpanElement;
  private _popup: Popup | null = null;
  private _ticker = new Ticker(() => this._render());
}

/** The panel opened by clicking the status-bar item. */
export class BalancePanel extends Widget {
  constructor(model: BalanceModel, saver: SaveBeforeStop | null = null) {
    super();
    this._model = model;
    this._saver = saver;
    this.addClass('gp-BalancePanel');
    this.node.dataset.gpupool = 'panel';
    model.changed.connect(this._render, this);
    saver?.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._ticker.update(false);
    this._model.changed.disconnect(this._render, this);
    this._saver?.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const me = this._model.data;
    const now = Date.now();
    const node = this.node;
    node.textContent = '';
    node.append(el('h3', 'gp-BalancePanel-title', 'GPU pool'));
    if (!me) {
      node.dataset.state = 'unavailable';
      node.append(el('p', 'gp-BalancePanel-muted', UNAVAILABLE));
      if (this._model.error) {
        node.append(el('p', 'gp-BalancePanel-muted gp-BalancePanel-reason', this._model.error));
      }
      this._ticker.update(false);
      return;
    }
    const unit = me.unit || 'tokens';
    const s = summarize(me, now);
    node.dataset.state = s.state;

    const floorBox = s.floorNear ? floorStopBox(me, s, now) : null;
    if (floorBox && s.floorFirst) {
      node.append(floorBox); // the floor stop comes first: it heads the warnings
    }
    if (me.cull_warning && !s.floorFirst) {
      const box = el('div', 'gp-BalancePanel-cull');
      box.dataset.gpupool = 'cull';
      box.append(
        el('strong', undefined, `\u26a0 ${capitalize(formatCullWarning(me.cull_warning, now))}`),
        el('div', undefined, me.cull_warning.reason)
      );
      if (cullDone(me.cull_warning)) {
        box.append(el('div', undefined, KERNELS_STOPPED_DETAIL));
      }
      node.append(box);
    }
    if (floorBox && !s.floorFirst) {
      node.append(floorBox);
    }
    const note = this._saver ? saveNote(this._saver.status) : '';
    if (note) {
      const saved = el('div', 'gp-BalancePanel-saved', note);
      saved.dataset.gpupool = 'saved';
      saved.dataset.state = this._saver!.status.state;
      node.append(saved);
    }
    const notices = noticesBox(me, this._model.serverSettings, () => void this._model.refresh());
    if (notices) {
      node.append(notices);
    }
    appendMemoryWarnings(node, me.memory_warnings, now);
    const activity = renderActivity(me, now); // the GPUs at work, queue places (gpus.ts)
    if (activity) {
      node.append(activity);
    }
    if (me.accounting?.status === 'delayed') {
      const box = el('div', 'gp-BalancePanel-delayed');
      box.dataset.gpupool = 'delayed';
      box.append(el('strong', undefined, 'Accounting delayed'));
      if (me.accounting.message) {
        box.append(el('div', undefined, me.accounting.message));
      }
      node.append(box);
    }

    const dl = el('dl', 'gp-BalancePanel-facts');
    const fact = (label: string, value: string, cls?: string) => {
      if (!value) {
        return;
      }
      dl.append(el('dt', undefined, label), el('dd', cls, value));
    };
    fact('Balance', `${s.balance} (${stateLabel(s.state)})`, 'gp-BalancePanel-balance');
    fact('Floor', formatAmount(me.floor, unit));
    fact('Burn rate', s.burn ? `${s.burn.replace('/h', '')} ${unit}/h` : 'nothing running');
    const floorAt = floorStopAt(me, now);
    fact(
      'Floor reached',
      Number.isNaN(floorAt) ? '' : `${s.timeLeft} (${localTime(new Date(floorAt).toISOString())}): GPU servers stop then`
    );
    fact(
      'Last debit',
      me.last_debit_at ? `${formatRelative(me.last_debit_at, now)} (${localTime(me.last_debit_at)})` : 'none yet'
    );
    const c = me.credits;
    if (c) {
      if (c.daily && Number(c.daily) !== 0) {
        fact('Next daily credit', creditText(c.daily, c.next_daily_at, unit, now));
      }
      if (c.monthly && Number(c.monthly) !== 0) {
        fact('Next monthly credit', creditText(c.monthly, c.next_monthly_at, unit, now));
      }
      if (c.max_balance) {
        fact('Credits stop at', formatAmount(c.max_balance, unit));
      }
    }
    node.append(dl);

    node.append(el('h4', 'gp-BalancePanel-subtitle', 'GPUs held'));
    const allocations = me.allocations || [];
    if (!allocations.length) {
      node.append(el('p', 'gp-BalancePanel-muted', 'No GPUs held.'));
    } else {
      const table = el('table', 'gp-BalancePanel-gpus');
      table.dataset.gpupool = 'gpus';
      const head = el('tr');
      for (const h of ['Server', 'GPUs', 'Price', 'Since']) {
        head.append(el('th', undefined, h));
      }
      table.append(head);
      for (const a of allocations) {
        table.append(allocationRow(a, unit, now));
      }
      node.append(table);
    }
    if (me.pages_url) {
      const link = el('a', 'gp-BalancePanel-usage', 'My GPU usage: charts and history');
      link.href = me.pages_url;
      link.target = '_blank';
      link.rel = 'noopener';
      link.dataset.gpupool = 'usage-link';
      const p = el('p');
      p.append(link);
      node.append(p);
    }
    node.append(
      el('p', 'gp-BalancePanel-muted gp-BalancePanel-updated', `Updated ${localTime(new Date(this._model.updatedAt).toISOString())}`)
    );
    this._ticker.update((!!me.cull_warning && !cullDone(me.cull_warning)) || hasCountdown(me) || s.floorNear);
  }

  private _model: BalanceModel;
  private _saver: SaveBeforeStop | null;
  private _ticker = new Ticker(() => this._render());
}

/**
 * The panel's box for the floor stop: what happens, when (local time), and, when a cull
 * warning stands, that the floor stop comes before it (issue 39.6).
 */
function floorStopBox(me: IMe, s: ISummary, now: number): HTMLElement {
  const box = el('div', 'gp-BalancePanel-cull gp-BalancePanel-floor');
  box.dataset.gpupool = 'floor';
  const at = floorStopAt(me, now);
  box.append(
    el('strong', undefined, `\u26a0 ${capitalize(s.floorStop)}`),
    el('div', undefined, floorStopDetail(localTime(new Date(at).toISOString())))
  );
  if (s.floorFirst && me.cull_warning) {
    const cull = el('div', 'gp-BalancePanel-muted', `This comes before the cull warning (${formatCullWarning(me.cull_warning, now)}): ${me.cull_warning.reason}`);
    cull.dataset.gpupool = 'cull';
    box.append(cull);
  }
  return box;
}

function allocationRow(a: IAllocation, unit: string, now: number): HTMLTableRowElement {
  const row = el('tr');
  row.dataset.allocation = a.id;
  const server = el('td', undefined, a.server || 'default');
  if (a.borrowed) {
    server.append(' ', el('span', 'gp-BalancePanel-borrowed', 'borrowed'));
  }
  const gpus = el('td');
  gpus.append(el('div', undefined, a.gpus.map(formatGpu).join(', ') || '—'));
  const where = a.description || a.node;
  if (where) {
    gpus.append(el('div', 'gp-BalancePanel-muted', where));
  }
  row.append(
    server,
    gpus,
    el('td', 'gp-BalancePanel-price', formatPrice(a, unit)),
    el('td', undefined, a.started_at ? formatRelative(a.started_at, now) : '')
  );
  return row;
}

function creditText(amount: string, at: string | null, unit: string, now: number): string {
  const plus = `+${roundDecimal(amount, 1)} ${unit}`;
  return at ? `${plus} ${formatRelative(at, now)} (${localTime(at)})` : plus;
}

function localTime(iso: string): string {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) {
    return iso;
  }
  return d.toLocaleString(undefined, {
    month: 'short',
    day: 'numeric',
    hour: '2-digit',
    minute: '2-digit'
  });
}

function capitalize(text: string): string {
  return text ? text[0].toUpperCase() + text.slice(1) : text;
}

export type { IMe };
