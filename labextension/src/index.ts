/**
 * @gpupool/hub-balance: a JupyterLab status-bar item with the user's
 * gpupool_hub token balance, the burn rate of their GPU servers, the time
 * left until the floor and cull warnings; a click opens the details panel.
 * When a countdown to a stop arrives, it saves the open documents (save.ts).
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { BalanceModel, DEFAULT_INTERVAL_S } from './model';
import { hasModified, pendingStop, saveModified, SaveBeforeStop } from './save';
import { BalanceStatusItem } from './widget';

export const PLUGIN_ID = '@gpupool/hub-balance:plugin';
export const STATUS_ITEM_ID = '@gpupool/hub-balance:status';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Shows the gpupool_hub token balance in the status bar.',
  autoStart: true,
  optional: [IStatusBar, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    if (!statusBar) {
      return; // e.g. a front end without a status bar: nothing to show.
    }
    // Work saved before GPUs are taken: every open document with unsaved changes (save.ts).
    const documents = () => app.shell.widgets('main');
    const saver = new SaveBeforeStop({ saveAll: () => saveModified(documents()) });
    const model = new BalanceModel({
      serverSettings: app.serviceManager.serverSettings,
      intervalSeconds: DEFAULT_INTERVAL_S,
      keepAwake: () => saver.enabled && hasModified(documents())
    });
    // Until the settings are read, a countdown waits: saving may be turned off there.
    let settingsRead = !settingRegistry;
    const follow = () => {
      if (settingsRead) {
        saver.update(pendingStop(model.data));
      }
    };
    model.changed.connect(follow);
    const item = new BalanceStatusItem(model, saver);
    statusBar.registerStatusItem(STATUS_ITEM_ID, { item, align: 'left', rank: 100 });

    if (settingRegistry) {
      const apply = (settings: ISettingRegistry.ISettings) => {
        model.setInterval(settings.get('pollInterval').composite as number);
        saver.enabled = settings.get('saveBeforeStop').composite !== false;
      };
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          apply(settings);
          settings.changed.connect(apply);
        })
        .catch(reason => {
          console.warn(`${PLUGIN_ID}: settings not loaded, polling every ${DEFAULT_INTERVAL_S} s`, reason);
        })
        .finally(() => {
          settingsRead = true;
          follow();
        });
    }
  }
};

export default plugin;
