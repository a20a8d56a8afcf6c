/**
 * @gpupool/hub-balance: a JupyterLab status-bar item with the user's
 * gpupool_hub token balance, the burn rate of their GPU servers, the time
 * left until the floor and cull warnings; a click opens the details panel.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { BalanceModel, DEFAULT_INTERVAL_S } from './model';
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
    const model = new BalanceModel({
      serverSettings: app.serviceManager.serverSettings,
      intervalSeconds: DEFAULT_INTERVAL_S
    });
    const item = new BalanceStatusItem(model);
    statusBar.registerStatusItem(STATUS_ITEM_ID, { item, align: 'left', rank: 100 });

    if (settingRegistry) {
      const apply = (settings: ISettingRegistry.ISettings) => {
        model.setInterval(settings.get('pollInterval').composite as number);
      };
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          apply(settings);
          settings.changed.connect(apply);
        })
        .catch(reason => {
          console.warn(`${PLUGIN_ID}: settings not loaded, polling every ${DEFAULT_INTERVAL_S} s`, reason);
        });
    }
  }
};

export default plugin;
